"""`JobConfig`: every setting of a job in one nested, frozen object, validated once.

Sections (each a frozen dataclass with its own `validate`):

- run       RunSettings       which method, seed, how many learners, how long, torch threads
- model     ModelSettings     the built-in model, its data, evaluation and inner optimizer
- protocol  ProtocolSettings  fragments, schedule, syncer, outer optimizer, wire, receipt
- world     WorldSettings     the simulated world: step times, links, failures, chaos scenario
- live      LiveConfig        the live runtime: ports, heartbeats, pacing, chaos, comm mode

A key is written `section.key` (`protocol.P`), or bare (`P`) where no other section has that
name. Drivers get `job.sim` (the flat `SimConfig` of the first four sections: `cfg.P`,
`cfg.learners`, ...) and `job.live`: the same objects for every driver of a job.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache, cached_property
from typing import TYPE_CHECKING

from atoll.config.live import LiveConfig
from atoll.config.settings import (
    ModelSettings,
    ProtocolSettings,
    RunSettings,
    SimConfig,
    WorldSettings,
)
from atoll.errors import ConfigError

if TYPE_CHECKING:
    from atoll.core.learner import LearnerConfig
    from atoll.core.syncer import SyncerConfig

SIM_SECTIONS: dict[str, type] = {
    "run": RunSettings,
    "model": ModelSettings,
    "protocol": ProtocolSettings,
    "world": WorldSettings,
}
SECTIONS: dict[str, type] = {**SIM_SECTIONS, "live": LiveConfig}


@cache
def field_types(cls: type) -> dict[str, object]:
    """A settings dataclass's field types, resolved (`typing.get_type_hints`), by field name."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def resolve_key(
    key: str, value: object = None, sections: Mapping[str, type] = SECTIONS
) -> tuple[str, str]:
    """(section, field) of `section.key` or of a bare key that one section alone has. An
    unknown key is a ConfigError suggesting the close spellings; an ambiguous bare key one
    naming its sections."""
    if "." in key:
        section, name = key.split(".", 1)
        if section in sections and name in field_types(sections[section]):
            return section, name
    else:
        owners = [s for s, cls in sections.items() if key in field_types(cls)]
        if len(owners) == 1:
            return owners[0], key
        if owners:
            spelled = " or ".join(f"{s}.{key}" for s in owners)
            raise ConfigError(key, value, f"a key of one section: write {spelled}")
    raise ConfigError(key, value, unknown_key_hint(key, sections))


def unknown_key_hint(key: str, sections: Mapping[str, type] = SECTIONS) -> str:
    """What a user is told about an unknown key: the known keys spelled closest to it (a
    known name under the wrong section first)."""
    pairs = [(s, n) for s, cls in sections.items() for n in field_types(cls)]
    dotted = [f"{s}.{n}" for s, n in pairs]
    name = key.split(".", 1)[-1]
    near = difflib.get_close_matches(name, {n for _, n in pairs}, n=3)
    close = [f"{s}.{n}" for m in near for s, n in pairs if n == m]
    close += [k for k in difflib.get_close_matches(key, dotted, n=3) if k not in close]
    where = f"a known key of the sections {', '.join(sections)} (README: settings)"
    if "live" not in sections and name in field_types(LiveConfig):
        where += f"; {name} is a live setting (atoll run, syncer, learner)"
    return f"{where}; did you mean {', '.join(close)}?" if close else where


def _section_default(name: str) -> object:
    return field(default_factory=SECTIONS[name])


@dataclass(frozen=True)
class JobConfig:
    run: RunSettings = _section_default("run")
    model: ModelSettings = _section_default("model")
    protocol: ProtocolSettings = _section_default("protocol")
    world: WorldSettings = _section_default("world")
    live: LiveConfig = _section_default("live")

    @cached_property
    def sim(self) -> SimConfig:
        """The flat view of run, model, protocol and world (one object per JobConfig)."""
        values = {}
        for name in SIM_SECTIONS:
            values.update(dataclasses.asdict(getattr(self, name)))
        return SimConfig(**values)

    def validate(self) -> JobConfig:
        """Each section's checks once, then those across sections."""
        m = self.run.validate().learners
        self.model.validate()
        self.protocol.validate(learners=m)  # quorum <= learners
        self.world.validate(learners=m)  # one speed factor per learner; the scenario's ids
        self.live.validate()
        self.live.shape_factors(m)  # one upload limit, or one per learner
        return self

    def learner_config(self) -> LearnerConfig:
        return self.protocol.learner_config()

    def syncer_config(self) -> SyncerConfig:
        return self.protocol.syncer_config()

    def replace(self, values: Mapping[str, Mapping[str, object]]) -> JobConfig:
        """This job with `values` (section -> field -> typed value) set."""
        sections = {
            s: dataclasses.replace(getattr(self, s), **dict(v)) for s, v in values.items() if v
        }
        return dataclasses.replace(self, **sections)

    def with_keys(self, values: Mapping[str, object]) -> JobConfig:
        """This job with typed values set by key (`section.key` or bare; `resolve_key`)."""
        by_section: dict[str, dict[str, object]] = {}
        for key, v in values.items():
            section, name = resolve_key(key, v)
            by_section.setdefault(section, {})[name] = v
        return self.replace(by_section)

    @classmethod
    def of(cls, sim: SimConfig, live: LiveConfig | None = None) -> JobConfig:
        """The job whose `sim` equals `sim` (and whose live section is `live`)."""
        parts = {
            s: sc(**{f.name: getattr(sim, f.name) for f in fields(sc)})
            for s, sc in SIM_SECTIONS.items()
        }
        return cls(**parts, live=live or LiveConfig())
