"""The magnitude guard: learners are trusted to be honest, not to be bug-free.

A learner whose model diverged, or whose code has a bug, can send a contribution that decodes
cleanly and is finite yet is far beyond anything the run has produced (int4 frames of -3e38
are valid frames). One such contribution merged would move the global fragment by as much, or
overflow it to inf. The guard refuses it before it touches any state (code `magnitude`,
action heal: the learner loads the global model again, which is what a diverged learner needs).

The measure is the delta's norm per square root of the steps it covers, |delta| / sqrt(steps)
(a learner that trained offline for longer sends a larger delta; inner steps add up roughly
like a random walk). For fragment p the guard keeps that measure of its last `WINDOW` accepted
contributions and refuses one above

    factor * median(recent)                    once WARMUP contributions were accepted
    factor * max(|Theta_base|, sqrt(n))        before (n values: a cold, generous bound)

The steps a contribution claims count for at most STEPS_SPAN times the recent median, so that
a header cannot buy itself a larger bound. `factor` = 0 turns the guard off. What the guard
has seen is not durable state: after a restart it starts cold.
"""

from __future__ import annotations

import math
from collections import deque

import torch

from atoll.core import held_figures
from atoll.core.messages import Refusal, Rejection

WINDOW = 32  # accepted contributions remembered per fragment
WARMUP = 8  # accepted contributions before the median is trusted
STEPS_SPAN = 64  # claimed steps count for at most this many times the recent median


def _median(xs: deque[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


class MagnitudeGuard:
    def __init__(self, fragments: int, factor: float) -> None:
        self.factor = factor
        self.rates: list[deque[float]] = [deque(maxlen=WINDOW) for _ in range(fragments)]
        self.steps: list[deque[float]] = [deque(maxlen=WINDOW) for _ in range(fragments)]

    def _steps(self, p: int, steps: int) -> float:
        s = float(max(steps, 1))
        if len(self.steps[p]) >= WARMUP:
            s = min(s, STEPS_SPAN * _median(self.steps[p]))
        return s

    def rate(self, p: int, delta: torch.Tensor, steps: int) -> float:
        """The guard's measure of a delta: |delta| / sqrt(steps counted)."""
        return self.rate_of(p, float(torch.linalg.vector_norm(delta)), steps)

    def rate_of(self, p: int, norm: float, steps: int) -> float:
        """The measure of a delta of norm `norm`."""
        return norm / math.sqrt(self._steps(p, steps))

    def check(self, p: int, rate: float, base: torch.Tensor) -> Rejection | None:
        """A refusal if fragment p's delta of measure `rate` (against `base`) is beyond the
        bound; nothing changes either way (`accept` records an accepted one)."""
        if self.factor <= 0:
            return None
        if not math.isfinite(rate):
            return Rejection(Refusal.MAGNITUDE, f"fragment {p}: the delta's norm is {rate}")
        if len(self.rates[p]) >= WARMUP:
            limit = self.factor * _median(self.rates[p])
            what = f"{self.factor:g} x the median of the last {len(self.rates[p])} accepted"
        else:
            floor = math.sqrt(max(base.numel(), 1))
            limit = self.factor * max(held_figures.norm(base), floor)
            what = f"{self.factor:g} x the fragment's norm (cold bound)"
        if rate > limit:
            return Rejection(
                Refusal.MAGNITUDE,
                f"fragment {p}: |delta|/sqrt(steps) = {rate:.4g} is beyond {limit:.4g} "
                f"({what}); the learner must heal",
            )
        return None

    def accept(self, p: int, rate: float, steps: int) -> None:
        if self.factor <= 0:
            return
        self.rates[p].append(rate)
        self.steps[p].append(float(max(steps, 1)))
