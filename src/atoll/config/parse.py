"""The one reader of settings: `--set key=value` strings and JSON/TOML files, typed by the
settings dataclasses' field types (`typing.get_type_hints`: bool, int, float, str, Literal).

A key is `section.key` (`protocol.P=12`) or bare (`P=12`) where one section alone has it. A
file holds sections as tables (`[protocol]` then `P = 24`) and/or bare keys at its top level.
`load_job` gives the validated `JobConfig`; `to_args` writes one back as `--set` arguments
(what the launcher passes its child processes), and reading those gives back an equal job.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Literal, get_args, get_origin

from atoll.compat import tomllib
from atoll.config.job import SECTIONS, SIM_SECTIONS, JobConfig, field_types, resolve_key
from atoll.config.live import LiveConfig
from atoll.config.settings import SimConfig
from atoll.errors import ConfigError

Values = dict[str, dict[str, object]]  # section -> field -> typed value


def add_set_argument(p: argparse.ArgumentParser, help: str) -> None:
    """The repeatable `--set KEY=VALUE` option whose values the parsers below read."""
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help
    )


def read_file(file: str | Path, sections: Mapping[str, type] = SECTIONS) -> list[tuple[str, str]]:
    """A JSON or TOML table of settings, as `(key, raw string)` pairs (booleans as true/false;
    a section's table gives `section.key` keys). A file that is not UTF-8 JSON/TOML, not a
    table, or holds a value that is not a number, string, boolean or section table is a
    ConfigError."""
    path = Path(file)
    if not path.is_file():
        raise ConfigError("config", str(file), "an existing .json or .toml file")
    kind = "JSON" if path.suffix == ".json" else "TOML"
    try:
        text = path.read_bytes().decode("utf-8")
        data = json.loads(text) if kind == "JSON" else tomllib.loads(text)
    except OSError as exc:
        raise ConfigError("config", str(file), f"a readable file ({exc.strerror})") from None
    except (ValueError, RecursionError) as exc:  # bad UTF-8, JSON or TOML; nesting too deep
        why = f"{type(exc).__name__}: {exc}"[:200]
        allowed = f"a UTF-8 {kind} table of settings ({why})"
        raise ConfigError("config", str(file), allowed) from None
    if not isinstance(data, dict):
        raise ConfigError("config", str(file), f"a {kind} table of key = value settings")
    out = []
    for k, v in data.items():
        if isinstance(v, dict) and k in sections:
            out += [(f"{k}.{name}", _raw(f"{k}.{name}", x)) for name, x in v.items()]
        elif isinstance(v, dict):
            allowed = f"a section ({', '.join(sections)}) or a key = value setting"
            raise ConfigError(k, v, allowed)
        else:
            out.append((k, _raw(k, v)))
    return out


def _raw(key: str, v: object) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float, str)):
        return str(v)
    raise ConfigError(key, v, "a number, a string or a boolean (one setting per key)")


def parse(
    pairs: list[str], file: str | Path | None = None, sections: Mapping[str, type] = SECTIONS
) -> Values:
    """Typed values from a settings file, then `key=value` strings (a later value of a key
    wins, however it is spelled), by section."""
    items = read_file(file, sections) if file else []
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError("--set", pair, "key=value (or section.key=value)")
        key, raw = pair.split("=", 1)
        items.append((key.strip(), raw))
    out: Values = {s: {} for s in sections}
    for key, raw in items:
        section, name = resolve_key(key, raw, sections)
        out[section][name] = convert(key, raw, field_types(sections[section])[name])
    return out


def convert(key: str, raw: str, typ: object) -> object:
    """`raw` read as a value of the field type `typ`; a ConfigError naming `key` if it is
    not one."""
    if get_origin(typ) is Literal:
        allowed = get_args(typ)
        if raw not in allowed:
            raise ConfigError(key, raw, f"one of {', '.join(map(str, allowed))}")
        return raw
    if typ is str:
        return raw
    try:
        if typ is bool:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if typ is int:
            return int(raw)
        if typ is not float:
            raise TypeError(f"setting {key}: no reader for the type {typ!r}")
        v = float(raw)
    except ValueError:  # (also an int of more digits than Python converts)
        raise ConfigError(key, raw, f"a value of type {typ.__name__}") from None
    if not math.isfinite(v):
        raise ConfigError(key, raw, "a finite number")
    return v


def load_job(
    pairs: list[str], file: str | Path | None = None, base: Mapping[str, object] | None = None
) -> JobConfig:
    """The validated settings of a job: defaults < `base` (typed, by key) < file < `--set`."""
    values = parse(pairs, file)
    return JobConfig().with_keys(base or {}).replace(values).validate()


def build(
    pairs: list[str], file: str | Path | None = None, base: dict[str, object] | None = None
) -> tuple[SimConfig, LiveConfig]:
    """(job.sim, job.live) of `load_job`."""
    job = load_job(pairs, file, base)
    return job.sim, job.live


def parse_overrides(pairs: list[str], file: str | Path | None = None) -> dict[str, object]:
    """SimConfig overrides by field name (`atoll sim --set`; no live keys)."""
    return _flat(parse(pairs, file, SIM_SECTIONS))


def split_overrides(
    pairs: list[str], file: str | Path | None = None
) -> tuple[dict[str, object], dict[str, object]]:
    """(SimConfig overrides, LiveConfig overrides) by field name."""
    values = parse(pairs, file)
    return _flat({s: values[s] for s in SIM_SECTIONS}), dict(values["live"])


def _flat(values: Values) -> dict[str, object]:
    return {name: v for section in values.values() for name, v in section.items()}


def to_args(job: JobConfig) -> list[str]:
    """`--set section.key=value` arguments reproducing every non-default setting of `job`
    (for child processes): `load_job(to_args(job))` equals `job`."""
    out = []
    default = JobConfig()
    for section in SECTIONS:
        ours, theirs = getattr(job, section), getattr(default, section)
        for f in fields(ours):
            v = getattr(ours, f.name)
            if v != getattr(theirs, f.name):
                out += ["--set", f"{section}.{f.name}={v}"]
    return out
