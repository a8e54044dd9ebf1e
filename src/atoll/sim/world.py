"""The simulated world every method shares: step times, the failure schedule, links, evaluation
points and the books of a run. Same seed -> same world for every method. (The model, data and
training recipe are atoll.model.recipe / atoll.model.train.)"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from atoll.bandwidth.model import ring_allreduce_bytes
from atoll.chaos import Fault, Scenario, load
from atoll.config import SimConfig
from atoll.core.budget import RunEnd, TokenBudget


def run_end(cfg: SimConfig) -> RunEnd:
    """The syncer's token budget and run end (core/budget.py): in virtual time every learner
    hears the stop at once (no heartbeat period: `after_s` 0)."""
    return RunEnd(TokenBudget(cfg.budget_tokens()))


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


class Windows:
    """Time windows [start, end) in which something runs at a fraction `rate` of its speed
    (0: not at all): a learner's stalls (its steps), its link's cuts and slowdowns (chaos).
    Where windows overlap, the slowest rate holds. Each window has a tag (the fault kind)."""

    def __init__(self) -> None:
        self.items: list[tuple[float, float, float, str]] = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, start: float, end: float, rate: float, tag: str) -> None:
        self.items.append((start, end, rate, tag))

    def end_early(self, now: float, tag: str) -> None:
        """Windows of `tag` stop at `now` (a stalled process that is killed)."""
        kept = []
        for s, e, r, t in self.items:
            if t == tag and s >= now:
                continue
            kept.append((s, min(e, now) if t == tag else e, r, t))
        self.items = kept

    def rate_at(self, t: float) -> float:
        return min((r for s, e, r, _ in self.items if s <= t < e), default=1.0)

    def advance(self, t: float, work: float) -> float:
        """When `work` seconds (at full speed) begun at `t` are done."""
        while True:
            nxt = min((x for s, e, _, _ in self.items for x in (s, e) if x > t), default=math.inf)
            rate = self.rate_at(t)
            if rate > 0 and t + work / rate <= nxt:
                return t + work / rate
            work = max(work - (nxt - t) * rate, 0.0)
            t = nxt

    def open_at(self, t: float) -> float:
        """The first time >= t outside every window of rate 0."""
        while True:
            ends = [e for s, e, r, _ in self.items if r == 0 and s <= t < e]
            if not ends:
                return t
            t = max(ends)


@dataclass
class Link:
    """One direction of a learner's link: FIFO, `bandwidth` bits/s, fixed latency; `outages`
    (chaos): windows where it is cut (rate 0) or slowed, shared by both directions."""

    bandwidth_bps: float
    latency_s: float
    busy_until: float = 0.0
    bytes_sent: int = 0
    outages: Windows | None = None

    def transfer(self, now: float, nbytes: int) -> float:
        """Queue `nbytes` at `now`; returns the arrival time."""
        start = max(now, self.busy_until)
        if self.outages:
            self.busy_until = self.outages.advance(start, 8.0 * nbytes / self.bandwidth_bps)
            self.bytes_sent += nbytes
            return self.outages.open_at(self.busy_until + self.latency_s)
        self.busy_until = start + 8.0 * nbytes / self.bandwidth_bps
        self.bytes_sent += nbytes
        return self.busy_until + self.latency_s

    def open_at(self, t: float) -> float:
        """When a message due at `t` can arrive: after any cut it falls in."""
        return self.outages.open_at(t) if self.outages else t

    def reset(self, now: float) -> None:
        """The endpoint died: whatever was queued is dropped."""
        self.busy_until = now


def dp_equivalent_bytes(cfg: SimConfig, tokens: int, model_bytes: int) -> int:
    """Bytes a data-parallel ring all-reduce of fp32 gradients sends for `tokens` tokens."""
    dp_steps = tokens / (cfg.learners * cfg.batch * cfg.context)
    return int(dp_steps * cfg.learners * ring_allreduce_bytes(model_bytes, cfg.learners))


def ring_allreduce_time(nbytes: int, workers: int, bandwidth_bps: float, latency_s: float) -> float:
    if workers <= 1:
        return 0.0
    return (
        8.0 * ring_allreduce_bytes(nbytes, workers) / bandwidth_bps + 2 * (workers - 1) * latency_s
    )


# the run statistics (atoll.metrics.run_stats) a RunResult carries as they are
STAT_KEYS = (
    "rounds", "participants_mean", "participants_hist", "staleness_mean", "staleness_max",
    "blocked_s", "down_s", "lost_work_s", "failures",
)  # fmt: skip


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
    bytes_heal: int = 0  # part of bytes_down: whole models sent to (re)joining learners
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


def scenario_of(cfg: SimConfig) -> Scenario | None:
    """The run's chaos scenario (setting `scenario`), checked; None without one."""
    if not cfg.scenario:
        return None
    return load(cfg.scenario, cfg.downtime_s).validate(cfg.learners)


def horizon_s(cfg: SimConfig, scenario: Scenario) -> float:
    """The horizon of random faults: the scenario's own, else 1.5 x the nominal training time
    (steps x step_time_s x the slowest speed factor), so that rates still apply when faults
    make the run longer."""
    return scenario.horizon_s or 1.5 * cfg.steps * cfg.step_time_s * max(cfg.speed_factors())


def timeline(cfg: SimConfig) -> list[Fault]:
    """The run's faults, in virtual seconds (random ones drawn from `seed`)."""
    sc = scenario_of(cfg)
    return [] if sc is None else sc.timeline(cfg.learners, horizon_s(cfg, sc), cfg.seed)
