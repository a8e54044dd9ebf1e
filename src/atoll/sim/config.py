"""Settings of a simulated run, their validation, and `--set key=value` parsing."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, fields

from atoll.errors import ConfigError

METHODS = ("data_parallel", "sync_diloco", "decoupled")


@dataclass(frozen=True)
class SimConfig:
    # run
    method: str = "decoupled"
    seed: int = 0
    learners: int = 4  # M
    steps: int = 150  # inner steps per learner; token budget = learners*steps*batch*context
    threads: int = 1  # torch threads (the math is identical for a given value)
    # model and data
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 4
    context: int = 64
    batch: int = 16
    data: str = "stdlib"  # "stdlib" or comma-separated text file paths
    data_bytes: int = 4_000_000
    shard_block: int = 4096  # bytes per block dealt round robin to learners; 0 = contiguous
    eval_batches: int = 8
    eval_points: int = 8
    # inner optimizer (AdamW, linear warmup then cosine to 10% over `steps`)
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.0
    # fragments and schedule
    P: int = 24
    H: int = 24
    tau: int = 2
    packing: str = "balanced"
    schedule: str = "pull"  # "pull": the syncer paces rounds; "push": each learner's step count
    # syncer
    quorum: int = 1  # K
    grace: bool = True
    grace_gamma: float = 0.5
    grace_ema: float = 0.1
    merge: str = "rda"
    weighting: str = "tokens"
    # outer optimizer: plain SGD with lr 1 (the merged value itself) measured best at this
    # scale; Nesterov (0.7, 0.9) lost 0.3-0.4 nats (benchmarks/results/outer_sweep.json)
    outer: str = "sgd"
    outer_lr: float = 1.0
    outer_momentum: float = 0.9
    outer_delay: int = 4
    # wire
    codec: str = "int4"
    down_codec: str = "fp32"
    group: int = 64
    error_feedback: bool = True
    sync_codec: str = "fp32"  # outer-gradient all-reduce of synchronous DiLoCo
    # learner receipt
    receipt: str = "overwrite"
    alpha: float = 0.5
    block: bool = True
    # simulated hardware
    step_time_s: float = 1.0
    speeds: str = "1"  # step-time factor per learner, comma separated (one value: all)
    speed_noise: float = 0.0  # relative std of each step's time
    bandwidth_mbps: float = 1000.0  # per learner link, each direction
    latency_ms: float = 20.0
    # failures (per learner Poisson; 0 = none)
    mtbf_s: float = 0.0
    downtime_s: float = 30.0
    downtime_jitter: float = 0.5

    def speed_factors(self) -> list[float]:
        try:
            vals = [float(x) for x in str(self.speeds).split(",") if x.strip()]
        except ValueError:
            raise ConfigError("speeds", self.speeds, "comma-separated numbers > 0") from None
        if len(vals) == 1:
            vals = vals * self.learners
        if len(vals) != self.learners or any(v <= 0 for v in vals):
            raise ConfigError(
                "speeds",
                self.speeds,
                f"one number > 0, or {self.learners} of them (one per learner)",
            )
        return vals

    def token_budget(self) -> int:
        return self.learners * self.steps * self.batch * self.context

    def validate(self) -> SimConfig:
        def need(ok: bool, key: str, allowed: str) -> None:
            if not ok:
                raise ConfigError(key, getattr(self, key), allowed)

        need(self.method in METHODS, "method", f"one of {METHODS}")
        need(self.learners >= 1, "learners", "an integer >= 1")
        need(self.steps >= 1, "steps", "an integer >= 1")
        need(self.threads >= 1, "threads", "an integer >= 1")
        for k in (
            "n_layer",
            "d_model",
            "n_head",
            "context",
            "batch",
            "eval_batches",
            "eval_points",
            "group",
        ):
            need(getattr(self, k) >= 1, k, "an integer >= 1")
        need(self.d_model % self.n_head == 0, "d_model", f"a multiple of n_head={self.n_head}")
        need(self.lr > 0, "lr", "a number > 0")
        need(self.shard_block >= 0, "shard_block", "an integer >= 0 (0 = contiguous shards)")
        need(self.warmup >= 0, "warmup", "an integer >= 0")
        need(self.H >= 1, "H", "an integer >= 1")
        need(self.schedule in ("pull", "push"), "schedule", "'pull' or 'push'")
        need(1 <= self.P <= self.H, "P", f"an integer in [1, H={self.H}]")
        need(0 <= self.tau < self.H, "tau", f"an integer in [0, H={self.H})")
        need(
            1 <= self.quorum <= self.learners,
            "quorum",
            f"an integer in [1, learners={self.learners}] (K <= M)",
        )
        need(self.step_time_s > 0, "step_time_s", "a number > 0")
        need(self.speed_noise >= 0, "speed_noise", "a number >= 0")
        need(self.bandwidth_mbps > 0, "bandwidth_mbps", "a number > 0 (megabits per second)")
        need(self.latency_ms >= 0, "latency_ms", "a number >= 0")
        need(self.mtbf_s >= 0, "mtbf_s", "a number >= 0 (0 = no failures)")
        need(self.downtime_s >= 0, "downtime_s", "a number >= 0")
        need(0 <= self.downtime_jitter < 1, "downtime_jitter", "a number in [0, 1)")
        self.speed_factors()
        return self


def add_set_argument(p: argparse.ArgumentParser, help: str) -> None:
    """The repeatable `--set KEY=VALUE` option whose values `parse_overrides` reads."""
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help
    )


def parse_overrides(pairs: list[str]) -> dict[str, object]:
    """Parse `key=value` strings into typed values of SimConfig fields."""
    types = {f.name: f.type for f in fields(SimConfig)}
    out: dict[str, object] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError("--set", pair, "key=value")
        key, raw = pair.split("=", 1)
        key = key.strip()
        if key not in types:
            raise ConfigError(key, raw, f"a known key; known keys: {', '.join(sorted(types))}")
        out[key] = _convert(key, raw, types[key])
    return out


def _convert(key: str, raw: str, typ: object) -> object:
    name = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if name == "bool":
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if name == "int":
            return int(raw)
        if name == "float":
            return float(raw)
        return raw
    except ValueError:
        raise ConfigError(key, raw, f"a value of type {name}") from None


def with_overrides(cfg: SimConfig, overrides: dict[str, object]) -> SimConfig:
    return dataclasses.replace(cfg, **overrides)
