"""Minimum quorum and the adaptive grace window.

A round for fragment p may close once K learners have contributed (the quorum). After that
the syncer keeps accepting learners for a grace window

    grace = clamp(gamma * slack, 0, step)        slack = tau*step - (quorum + sync)

where step, quorum and sync are exponential moving averages (decay `ema`) of the learners'
step time, the time from a round's first send to its quorum, and the time to merge and
deliver the result. The window only spends slack inside the tau-step overlap, so a learner
never waits for it. atoll's defaults: gamma = 0.5, ema = 0.1. The round also closes at once when
every live learner has contributed.
"""

from __future__ import annotations

from dataclasses import dataclass

from atoll.errors import ConfigError

SPAN = 4.0  # one sample moves an average by at most this factor (before the EMA's decay)


@dataclass
class EMA:
    decay: float
    value: float | None = None

    def update(self, x: float) -> float:
        self.value = x if self.value is None else (1 - self.decay) * self.value + self.decay * x
        return self.value

    def update_within(self, x: float, span: float) -> float:
        """`update` with x first brought within [value/span, value*span]: one outlier (a
        learner's bug, a clock that jumped) moves the average by a bounded factor."""
        if self.value is not None and self.value > 0:
            x = min(max(x, self.value / span), self.value * span)
        return self.update(x)


class GracePolicy:
    def __init__(
        self, quorum: int, tau: int, gamma: float = 0.5, ema: float = 0.1, enabled: bool = True
    ) -> None:
        if quorum < 1:
            raise ConfigError("quorum", quorum, "an integer >= 1")
        if not 0 <= gamma < 1:
            raise ConfigError("grace_gamma", gamma, "a number in [0, 1)")
        if not 0 < ema <= 1:
            raise ConfigError("grace_ema", ema, "a number in (0, 1]")
        self.quorum, self.tau, self.gamma, self.enabled = quorum, tau, gamma, enabled
        self.step = EMA(ema)
        self.to_quorum = EMA(ema)
        self.sync = EMA(ema)

    def observe_step(self, x: float) -> None:
        """A learner's step time (bounded: SPAN times the current average at most)."""
        self.step.update_within(x, SPAN)

    def observe(self, ema: EMA, x: float) -> None:
        """A duration of the round (to quorum, to deliver): at most SPAN * tau step times."""
        step = self.step.value
        if step is not None and step > 0:
            x = min(x, SPAN * max(self.tau, 1) * step)
        ema.update(max(x, 0.0))

    def slack(self) -> float:
        if self.step.value is None:
            return 0.0
        return self.tau * self.step.value - (
            (self.to_quorum.value or 0.0) + (self.sync.value or 0.0)
        )

    def window(self) -> float:
        """Seconds to keep a round open after its quorum; 0 when disabled or unmeasured."""
        if not self.enabled or self.step.value is None:
            return 0.0
        return min(max(self.gamma * self.slack(), 0.0), self.step.value)
