"""Settings of a live run: the simulator's settings (model, data, protocol: atoll.sim.config)
plus the live-only ones below. `--set key=value` accepts keys of either; a config file is a
JSON or TOML table of the same keys."""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from atoll.errors import ConfigError
from atoll.sim.config import SimConfig, _convert


@dataclass(frozen=True)
class LiveConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0: an ephemeral port chosen by the launcher
    chunk_bytes: int = 256 * 1024
    heartbeat_s: float = 0.5
    lost_after_s: float = 3.0  # a learner silent this long is out of the quorum
    snapshot_every_s: float = 10.0
    snapshot_history: int = 8  # public versions per fragment kept in a snapshot
    tape_fsync: bool = False  # fsync every tape record (power-loss durability)
    wait_s: float = 0.0  # longest a learner waits at step s+tau for a late answer
    pace_s: float = 0.0  # built-in learner: step k ends at start + k*pace_s*speed (0: free)
    start_barrier: bool = True  # built-in learners start together once all have joined
    shape_mbps: str = "0"  # per-learner upload limit (token bucket), 0 = unshaped
    # built-in learner's communication: a child "process", "thread"s, or "auto": a process when
    # the machine has at least 2 cores per learner on it, else threads (fewer processes)
    comm: str = "auto"
    chaos: str = ""  # e.g. "kill:L1@20+3,stop:L2@30+2,kill:syncer@40+2" or "random:3"
    chaos_seed: int = 0
    restart_delay_s: float = 3.0
    max_wall_s: float = 900.0
    eval: bool = True

    def shape_factors(self, learners: int) -> list[float]:
        return _per_learner("shape_mbps", self.shape_mbps, learners, allow_zero=True)

    def validate(self) -> LiveConfig:
        if not 0 <= self.port < 65536:
            raise ConfigError("port", self.port, "an integer in [0, 65535] (0: ephemeral)")
        for k in ("heartbeat_s", "lost_after_s", "snapshot_every_s", "max_wall_s"):
            if not getattr(self, k) > 0:
                raise ConfigError(k, getattr(self, k), "a number > 0 (seconds)")
        if self.lost_after_s < 2 * self.heartbeat_s:
            raise ConfigError("lost_after_s", self.lost_after_s, "at least 2 * heartbeat_s")
        if self.chunk_bytes < 1024:
            raise ConfigError("chunk_bytes", self.chunk_bytes, "an integer >= 1024")
        if self.snapshot_history < 2:
            raise ConfigError("snapshot_history", self.snapshot_history, "an integer >= 2")
        check_comm(self.comm)
        if self.pace_s < 0:
            raise ConfigError("pace_s", self.pace_s, "a number >= 0 (seconds per step)")
        if self.wait_s < 0 or self.restart_delay_s < 0:
            raise ConfigError("wait_s/restart_delay_s", self.wait_s, "numbers >= 0")
        return self


def _per_learner(key: str, raw: str, n: int, allow_zero: bool = False) -> list[float]:
    try:
        vals = [float(x) for x in str(raw).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(key, raw, "comma-separated numbers") from None
    if len(vals) == 1:
        vals = vals * n
    if len(vals) != n or any(v < 0 or (v == 0 and not allow_zero) for v in vals):
        raise ConfigError(key, raw, f"one number, or {n} of them (one per learner)")
    return vals


def split_overrides(
    pairs: list[str], file: str | Path | None = None
) -> tuple[dict[str, object], dict[str, object]]:
    """(SimConfig overrides, LiveConfig overrides) from a config file and `key=value` strings."""
    sim_types = {f.name: f.type for f in fields(SimConfig)}
    live_types = {f.name: f.type for f in fields(LiveConfig)}
    raw: dict[str, str] = {}
    if file:
        path = Path(file)
        if not path.is_file():
            raise ConfigError("config", str(file), "an existing .json or .toml file")
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        raw.update({k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in data.items()})
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError("--set", pair, "key=value")
        k, v = pair.split("=", 1)
        raw[k.strip()] = v
    sim: dict[str, object] = {}
    live: dict[str, object] = {}
    for k, v in raw.items():
        if k in live_types:
            live[k] = _convert(k, v, live_types[k])
        elif k in sim_types:
            sim[k] = _convert(k, v, sim_types[k])
        else:
            known = sorted(set(sim_types) | set(live_types))
            raise ConfigError(k, v, f"a known key; known keys: {', '.join(known)}")
    return sim, live


def build(
    pairs: list[str], file: str | Path | None = None, base: dict[str, object] | None = None
) -> tuple[SimConfig, LiveConfig]:
    sim, live = split_overrides(pairs, file)
    base = dict(base or {})
    sim_base = {k: v for k, v in base.items() if k in {f.name for f in fields(SimConfig)}}
    live_base = {k: v for k, v in base.items() if k in {f.name for f in fields(LiveConfig)}}
    scfg = dataclasses.replace(SimConfig(), **{**sim_base, **sim}).validate()
    lcfg = dataclasses.replace(LiveConfig(), **{**live_base, **live}).validate()
    lcfg.shape_factors(scfg.learners)
    return scfg, lcfg


COMM_MODES = ("auto", "process", "thread")  # where a learner's communication runs


def check_comm(mode: str) -> str:
    if mode not in COMM_MODES:
        raise ConfigError("comm", mode, f"one of {', '.join(COMM_MODES)}")
    return mode


def resolve_comm(mode: str, learners_here: int, cores: int | None = None) -> str:
    """ "auto" -> "process" with at least 2 cores per learner on this machine, else "thread".

    Measured (docs/live.md): with cores to spare, a child process per learner keeps the
    communication off the training loop's GIL (+2.3% per step vs +4 to +5% for threads); with 4
    learners on 2 cores the extra processes cost more than they save (atoll demo: goodput
    76.6% vs 81.0%, rejoin 9.0 s vs 3.7 s)."""
    if check_comm(mode) != "auto":
        return mode
    if cores is None:  # the cores this process may run on (affinity), not the host's count
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        cores = cores or os.cpu_count() or 1
    return "process" if cores >= 2 * max(learners_here, 1) else "thread"


def to_args(scfg: SimConfig, lcfg: LiveConfig) -> list[str]:
    """`--set` arguments reproducing every non-default setting (for child processes)."""
    out = []
    for cfg, default in ((scfg, SimConfig()), (lcfg, LiveConfig())):
        for f in fields(cfg):
            v = getattr(cfg, f.name)
            if v != getattr(default, f.name):
                out += ["--set", f"{f.name}={v}"]
    return out
