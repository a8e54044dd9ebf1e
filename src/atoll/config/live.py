"""The live-only settings (`atoll run`, `atoll syncer`, `atoll learner`); the model, data and
protocol settings of a live run are those of `SimConfig` (atoll.config.settings)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from atoll.errors import ConfigError

COMM_MODES = ("auto", "process", "thread")  # where a learner's communication runs
DEVICES = ("auto", "cpu", "cuda")  # where the built-in learner trains (live/learner/devices.py)


def check_comm(mode: str) -> str:
    if mode not in COMM_MODES:
        raise ConfigError("comm", mode, f"one of {', '.join(COMM_MODES)}")
    return mode


@dataclass(frozen=True)
class LiveConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0: an ephemeral port chosen by the launcher
    chunk_bytes: int = 256 * 1024
    heartbeat_s: float = 0.5
    lost_after_s: float = 3.0  # a learner silent this long is out of the quorum
    # once the token budget is spent, how long a syncer waits for learners still connected to
    # send their final flush and leave before its run is over (core/budget.py, RunEnd); a
    # learner's finish() waits at most 10 s for its flush to be merged and 6 s for its last beat
    finish_window_s: float = 30.0
    snapshot_every_s: float = 10.0
    snapshot_history: int = 8  # public versions per fragment kept in a snapshot
    tape_fsync: bool = False  # fsync every tape record (power-loss durability)
    wait_s: float = 0.0  # longest a learner waits at step s+tau for a late answer
    # a learner that is not healed by its syncer this long after it starts gives up, with one
    # line saying what the last attempt met (e.g. connection refused at HOST:PORT)
    join_timeout_s: float = 60.0
    pace_s: float = 0.0  # built-in learner: step k ends at start + k*pace_s*speed (0: free)
    start_barrier: bool = True  # built-in learners start together once all have joined
    shape_mbps: str = "0"  # per-learner upload limit (token bucket), 0 = unshaped
    # built-in learner's communication: a child "process", "thread"s, or "auto": a process when
    # the machine has at least 2 cores per learner on it, else threads (fewer processes);
    # resolved at run time by atoll.live.comm_mode.resolve_comm
    comm: str = "auto"
    chaos: str = ""  # e.g. "kill:L1@20+3,stop:L2@30+2,kill:syncer@40+2" or "random:3"
    chaos_seed: int = 0
    restart_delay_s: float = 3.0
    # the supervisor keeps one warm spare process per learner a scenario kills or adds (its
    # imports done, waiting): a restart, or the `add`, activates it instead of starting Python
    # and torch then (seconds on a busy host)
    warm_spares: bool = True
    max_wall_s: float = 900.0
    # held-out evaluations: the final model's in the summary, and the syncer's global model's
    # while the run goes (at model.eval_points fractions of the budget; without a budget,
    # every eval_every_s seconds)
    eval: bool = True
    eval_every_s: float = 60.0
    # ranks per built-in learner: an island of N processes under torchrun (DDP inside, rank 0
    # talks to the syncer); one number, or one per learner ("1,2": mixed hardware)
    island_size: str = "1"
    # the built-in learner's device: "auto" (cuda:LOCAL_RANK when the host has a GPU, else the
    # CPU), "cpu" or "cuda"; its island's ranks use NCCL on GPUs, gloo on the CPU
    device: str = "auto"
    # syncer processes, each serving its share of the fragments (core/shards.py): `atoll run`
    # and `atoll syncer` start them all; at most the plan's fragments
    shards: int = 1
    # live sessions (and Pulls streams) a syncer takes at most, each shard alike (every learner
    # joins every shard); the next is refused (RESOURCE_EXHAUSTED); 3 server threads each
    max_learners: int = 100

    def shape_factors(self, learners: int) -> list[float]:
        return _per_learner("shape_mbps", self.shape_mbps, learners, allow_zero=True)

    def island_sizes(self, learners: int) -> list[int]:
        """Ranks of each learner's island (`island_size`)."""
        sizes = _per_learner("island_size", self.island_size, learners)
        if any(s != int(s) for s in sizes):
            raise ConfigError("island_size", self.island_size, "whole numbers of ranks >= 1")
        return [int(s) for s in sizes]

    def validate(self) -> LiveConfig:
        if not 0 <= self.port < 65536:
            raise ConfigError("port", self.port, "an integer in [0, 65535] (0: ephemeral)")
        for k in (
            "heartbeat_s",
            "lost_after_s",
            "finish_window_s",
            "snapshot_every_s",
            "max_wall_s",
        ):
            if not getattr(self, k) > 0:
                raise ConfigError(k, getattr(self, k), "a number > 0 (seconds)")
        if self.lost_after_s < 2 * self.heartbeat_s:
            raise ConfigError("lost_after_s", self.lost_after_s, "at least 2 * heartbeat_s")
        if self.chunk_bytes < 1024:
            raise ConfigError("chunk_bytes", self.chunk_bytes, "an integer >= 1024")
        if self.snapshot_history < 2:
            raise ConfigError("snapshot_history", self.snapshot_history, "an integer >= 2")
        check_comm(self.comm)
        if self.device not in DEVICES:
            raise ConfigError("device", self.device, f"one of {', '.join(DEVICES)}")
        if self.shards < 1:
            raise ConfigError("shards", self.shards, "an integer >= 1 (at most the fragments)")
        if self.max_learners < 1:
            raise ConfigError("max_learners", self.max_learners, "an integer >= 1")
        if not self.eval_every_s > 0:
            raise ConfigError("eval_every_s", self.eval_every_s, "a number > 0 (seconds)")
        if not 0 < self.join_timeout_s < math.inf:
            raise ConfigError("join_timeout_s", self.join_timeout_s, "a number > 0 (seconds)")
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
    if len(vals) != n or any(
        not v < math.inf or v < 0 or (v == 0 and not allow_zero) for v in vals
    ):
        raise ConfigError(key, raw, f"one finite number, or {n} of them (one per learner)")
    return vals
