"""The simulated world every method shares: step times, the failure schedule, links, evaluation
points and the books of a run. Same seed -> same world for every method. (The model, data and
training recipe are atoll.model.recipe / atoll.model.train.)"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from atoll.config import SimConfig


class StepClock:
    """Simulated step time of learner i: step_time_s * speed factor * (1 + noise*N(0,1))."""

    def __init__(self, cfg: SimConfig, index: int) -> None:
        self.base = cfg.step_time_s * cfg.speed_factors()[index]
        self.noise = cfg.speed_noise
        self.rng = random.Random(f"{cfg.seed}-clock-{index}")

    def draw(self) -> float:
        if self.noise == 0:
            return self.base
        return self.base * max(0.2, 1.0 + self.noise * self.rng.gauss(0.0, 1.0))


class FailureSchedule:
    """Per-learner Poisson failures (mean time between failures `mtbf_s`, counted from the
    end of the previous recovery) and downtimes of downtime_s * U(1-j, 1+j). The sequence of
    learner i depends only on the seed and i, so every method meets the same failures."""

    def __init__(self, cfg: SimConfig, index: int) -> None:
        self.mtbf, self.down, self.jitter = cfg.mtbf_s, cfg.downtime_s, cfg.downtime_jitter
        self.rng = random.Random(f"{cfg.seed}-failures-{index}")
        self.t = 0.0

    def next(self) -> tuple[float, float] | None:
        """(fail_at, recovered_at) of the next failure, or None without failures."""
        if self.mtbf <= 0:
            return None
        fail = self.t + self.rng.expovariate(1.0 / self.mtbf)
        down = self.down * self.rng.uniform(1 - self.jitter, 1 + self.jitter)
        self.t = fail + down
        return fail, fail + down


@dataclass
class Link:
    """One direction of a learner's link: FIFO, `bandwidth` bits/s, fixed latency."""

    bandwidth_bps: float
    latency_s: float
    busy_until: float = 0.0
    bytes_sent: int = 0

    def transfer(self, now: float, nbytes: int) -> float:
        """Queue `nbytes` at `now`; returns the arrival time."""
        start = max(now, self.busy_until)
        self.busy_until = start + 8.0 * nbytes / self.bandwidth_bps
        self.bytes_sent += nbytes
        return self.busy_until + self.latency_s

    def reset(self, now: float) -> None:
        """The endpoint died: whatever was queued is dropped."""
        self.busy_until = now


class EvalPoints:
    """Held-out evaluations at fractions k/n of the token budget, k = 1..n."""

    def __init__(self, budget: int, n: int) -> None:
        self.budget, self.n, self.next = budget, n, 1

    def due(self, tokens: int) -> int:
        """How many points `tokens` has reached since the last call (one step can pass
        several; the caller evaluates once and records that many points)."""
        passed = 0
        while self.next <= self.n and tokens >= self.budget * self.next / self.n:
            self.next += 1
            passed += 1
        return passed


def dp_equivalent_bytes(cfg: SimConfig, tokens: int, model_bytes: int) -> int:
    """Bytes a data-parallel ring all-reduce of fp32 gradients sends for `tokens` tokens."""
    dp_steps = tokens / (cfg.learners * cfg.batch * cfg.context)
    return int(dp_steps * cfg.learners * ring_allreduce_bytes(model_bytes, cfg.learners))


def ring_allreduce_bytes(nbytes: int, workers: int) -> int:
    """Bytes each worker sends in a ring all-reduce of an `nbytes` buffer."""
    return 0 if workers <= 1 else int(2 * (workers - 1) / workers * nbytes)


def ring_allreduce_time(nbytes: int, workers: int, bandwidth_bps: float, latency_s: float) -> float:
    if workers <= 1:
        return 0.0
    return (
        8.0 * ring_allreduce_bytes(nbytes, workers) / bandwidth_bps + 2 * (workers - 1) * latency_s
    )


@dataclass
class RunResult:
    """What one simulated method run reports (see README for every key)."""

    name: str
    method: str
    eval_loss: float = float("nan")
    tokens: int = 0
    wall_time_s: float = 0.0
    goodput: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    bytes_heal: int = 0  # part of bytes_down: full fp32 models sent to (re)joining learners
    dp_bytes: int = 0
    rounds: int = 0
    participants_mean: float = 0.0
    participants_hist: dict[str, int] = field(default_factory=dict)
    staleness_mean: float = 0.0
    staleness_max: int = 0
    blocked_s: float = 0.0
    down_s: float = 0.0
    lost_work_s: float = 0.0
    failures: int = 0
    curve: list[dict[str, float]] = field(default_factory=list)
    settings: dict[str, object] = field(default_factory=dict)


ProgressFn = Callable[[int, int], None]
