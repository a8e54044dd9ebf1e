"""The one typed config: JobConfig's sections, the loader (section.key and bare keys, TOML
sections, close spellings), the core configs built field by field, the live options built
from the job, and `to_args` round-tripping a job to the child processes."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Literal

import pytest

from atoll.config import (
    SECTIONS,
    JobConfig,
    ProtocolSettings,
    SimConfig,
    add_set_argument,
    load_job,
    parse_overrides,
    resolve_key,
    to_args,
)
from atoll.config.options import SyncerOptions, learner_options, syncer_options
from atoll.config.parse import parse
from atoll.core.choices import CHOICES, check_choices
from atoll.core.learner import LearnerConfig
from atoll.core.syncer import SyncerConfig
from atoll.errors import ConfigError

# fields of the core configs that are no setting of a job: set by the driver, not a protocol
# setting: how long a learner waits at a step boundary for a late answer (the virtual-time
# driver until it comes, as `block` asks; a live learner at most its `wait_s`, 0 by default)
NOT_SETTINGS = {SyncerConfig: set(), LearnerConfig: {"max_wait_s"}}


def _other(f: dataclasses.Field) -> object:
    """A valid value of a ProtocolSettings field other than its default."""
    if f.name in CHOICES:
        return next(v for v in CHOICES[f.name] if v != f.default)
    if f.name == "syncer_threads":  # "auto" or a count of cores
        return "1"
    if isinstance(f.default, bool):
        return not f.default
    if isinstance(f.default, int):
        return f.default + 1
    if isinstance(f.default, float):
        return f.default / 2 + 0.125 if f.name != "guard" else 3.0
    raise AssertionError(f"no other value for {f.name}")


@pytest.mark.parametrize("cls", [LearnerConfig, SyncerConfig])
def test_every_core_config_field_is_set_from_the_protocol_settings(cls):
    ps = ProtocolSettings(**{f.name: _other(f) for f in dataclasses.fields(ProtocolSettings)})
    ps.validate(learners=8)
    built = ps.learner_config() if cls is LearnerConfig else ps.syncer_config()
    job = JobConfig(protocol=ps)
    assert built == (job.learner_config() if cls is LearnerConfig else job.syncer_config())
    for f in dataclasses.fields(cls):
        if f.name in NOT_SETTINGS[cls]:
            continue
        # a new field of the core config without its line in learner_config/syncer_config
        # keeps its default here (every setting above differs from its default)
        assert getattr(built, f.name) == getattr(ps, f.name), f.name
        assert getattr(built, f.name) != f.default, f"{cls.__name__}.{f.name} not mapped"


NON_DEFAULT = [
    "run.learners=3",
    "seed=7",
    "model.lr=0.00123",
    "warmup=0",
    "data=stdlib",
    "protocol.P=12",
    "H=12",
    "merge=mean",
    "grace=false",
    "codec=int8",
    "alpha=0.25",
    "world.speeds=1,1.5,2",
    "latency_ms=0.1",
    "live.pace_s=0.1",
    "shape_mbps=5,0,2.5",
    "chaos=kill:L1@2+1",
    "tape_fsync=true",
    "eval=false",
]


def test_to_args_gives_back_an_equal_job():
    job = load_job(NON_DEFAULT)
    assert {s for s in SECTIONS if getattr(job, s) != getattr(JobConfig(), s)} == set(SECTIONS)
    p = argparse.ArgumentParser()
    add_set_argument(p, "")
    args = p.parse_args(to_args(job))
    back = load_job(args.overrides)
    assert back == job and back.sim == job.sim and back.live == job.live
    assert to_args(JobConfig()) == []


def test_sections_and_bare_keys_from_toml_and_set(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('learners = 3\n[protocol]\nP = 12\nH = 12\n[live]\nshape_mbps = "5,0,1"\n')
    job = load_job(["protocol.H=24", "P=6"], path)  # --set after the file; bare or dotted
    assert (job.run.learners, job.protocol.P, job.protocol.H) == (3, 6, 24)
    assert job.live.shape_factors(3) == [5.0, 0.0, 1.0]
    assert job.sim.P == 6 and job.sim.learners == 3 and job.sim is job.sim
    assert JobConfig.of(job.sim, job.live) == job
    demo = load_job([], None, {"learners": 2, "pace_s": 0.5})  # a command's own defaults
    assert demo.run.learners == 2 and demo.live.pace_s == 0.5
    assert load_job(["learners=5"], None, {"learners": 2}).run.learners == 5
    bad = tmp_path / "bad.toml"
    bad.write_text("[protocl]\nP = 2\n")
    with pytest.raises(ConfigError, match=r"protocl=.*a section \(run, model"):
        load_job([], bad)


@pytest.mark.parametrize(
    "pair, suggestion",
    [
        ("lerners=3", "run.learners"),
        ("protocol.steps=3", "run.steps"),
        ("proto.quorum=2", "protocol.quorum"),
        ("live.heartbeat=1", "live.heartbeat_s"),
    ],
)
def test_an_unknown_key_names_the_close_spellings(pair, suggestion):
    with pytest.raises(ConfigError, match="did you mean") as err:
        load_job([pair])
    assert suggestion in str(err.value)


def test_an_ambiguous_bare_key_names_its_sections():
    @dataclass(frozen=True)
    class A:
        port: int = 0

    @dataclass(frozen=True)
    class B:
        port: int = 0
        other: str = ""

    two = {"a": A, "b": B}
    with pytest.raises(ConfigError, match=r"write a\.port or b\.port"):
        parse(["port=1"], sections=two)
    assert parse(["b.port=1", "other=x"], sections=two) == {"a": {}, "b": {"port": 1, "other": "x"}}
    # every key of the real sections is unambiguous: a bare key always works
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert resolve_key(f.name) == (section, f.name)


@dataclass(frozen=True)
class _Typed:
    mode: Literal["a", "b"] = "a"
    n: int = 1
    x: float = 0.5
    on: bool = False


def test_values_are_read_by_their_resolved_field_types():
    got = parse(["mode=b", "n=3", "x=1e-3", "on=yes"], sections={"t": _Typed})["t"]
    assert got == {"mode": "b", "n": 3, "x": 0.001, "on": True}
    for pair, match in [
        ("mode=c", "one of a, b"),
        ("n=1.5", "type int"),
        ("x=inf", "finite"),
        ("on=2", "type bool"),
    ]:
        with pytest.raises(ConfigError, match=match):
            parse([pair], sections={"t": _Typed})


def test_allowed_values_come_from_the_core_constants():
    from atoll.core.merge import MERGES

    for key, allowed in CHOICES.items():
        bad = dataclasses.replace(ProtocolSettings(), **{key: "nope"})
        with pytest.raises(ConfigError, match=f"{key}='nope'.*{', '.join(allowed)}"):
            JobConfig(protocol=bad).validate()
    assert CHOICES["merge"] is MERGES
    check_choices(SyncerConfig(codec=""), empty_ok=("codec",))
    with pytest.raises(ConfigError, match="codec"):
        check_choices(SyncerConfig(codec=""))


def test_validate_checks_across_sections():
    with pytest.raises(ConfigError, match=r"quorum=.*learners=2"):
        load_job(["learners=2", "quorum=3"])
    with pytest.raises(ConfigError, match="shape_mbps"):
        load_job(["learners=2", "shape_mbps=1,2,3"])
    with pytest.raises(ConfigError, match="speeds"):
        load_job(["learners=2", "speeds=1,2,3"])


def test_sim_overrides_are_flat_and_refuse_live_keys():
    assert parse_overrides(["protocol.P=12", "learners=3"]) == {"P": 12, "learners": 3}
    with pytest.raises(ConfigError, match="live setting"):
        parse_overrides(["live.port=1"])


def test_live_options_are_built_from_the_job(tmp_path):
    sets = ["port=7070", "chunk_bytes=4096", "snapshot_history=3", "max_learners=150"]
    job = load_job(NON_DEFAULT + sets)
    assert job.live.max_learners == 150
    with pytest.raises(ConfigError, match="max_learners"):
        load_job(NON_DEFAULT + ["max_learners=0"])
    opts = syncer_options(job, tmp_path, "run", "secret-123", expect=2, tls_cert="c")
    for f in dataclasses.fields(SyncerOptions):
        if hasattr(job.live, f.name):
            assert getattr(opts, f.name) == getattr(job.live, f.name), f.name
    assert opts.token_budget == job.sim.budget_tokens() and opts.expect_learners == 2
    assert syncer_options(job, tmp_path, "r", "s", budget=False).token_budget == 0
    assert syncer_options(job, tmp_path, "r", "s").expect_learners == 3
    kw = learner_options(job, 2)
    assert kw["shape_mbps"] == 2.5 and kw["wait_s"] == job.live.wait_s
    from atoll.live.learner import LearnerOptions

    assert set(kw) <= {f.name for f in dataclasses.fields(LearnerOptions)}
    assert LearnerOptions(**kw).connect_timeout_s == job.live.join_timeout_s


def test_sim_config_is_the_flat_view_of_the_sections():
    job = load_job(NON_DEFAULT)
    flat = {k: v for s in ("run", "model", "protocol", "world") for k, v in
            dataclasses.asdict(getattr(job, s)).items()}  # fmt: skip
    assert job.sim == SimConfig(**flat)


def test_a_custom_models_token_budget_is_a_setting_of_its_own(tmp_path):
    """0 (the default): the built-in model's learners x steps x batch x context; set (> 0), it
    wins, for the syncer, the sim and the summary alike, whatever batch and context say."""
    job = load_job(["learners=3", "steps=10", "batch=4", "context=8"])
    assert job.run.token_budget == 0 and job.sim.budget_tokens() == 3 * 10 * 4 * 8
    job = load_job(["learners=3", "steps=10", "batch=4", "context=8", "token_budget=5000000"])
    assert job.sim.budget_tokens() == 5_000_000
    assert syncer_options(job, tmp_path, "r", "secret-123").token_budget == 5_000_000
    assert load_job(["run.token_budget=77"]).sim.budget_tokens() == 77
    toml = tmp_path / "job.toml"
    toml.write_text("[run]\ntoken_budget = 4_096_000\n")
    assert load_job([], str(toml)).sim.budget_tokens() == 4_096_000
    with pytest.raises(ConfigError, match=r"^token_budget=-1 is not allowed: an integer >= 0"):
        load_job(["token_budget=-1"])
    with pytest.raises(ConfigError, match=r"^token_budget="):
        load_job(["token_budget=lots"])


def test_the_join_timeout_is_a_live_setting_the_learner_gets():
    job = load_job(["join_timeout_s=7.5"])
    assert learner_options(job, 0)["connect_timeout_s"] == 7.5
    assert learner_options(load_job([]), 0)["connect_timeout_s"] == 60.0
    for bad in ("0", "-1", "inf"):
        with pytest.raises(ConfigError, match=r"^join_timeout_s="):
            load_job([f"join_timeout_s={bad}"])
