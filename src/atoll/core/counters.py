"""Per-fragment counters kept by a learner, and the merge weight they give.

For each fragment the learner counts inner steps and tokens since it last *received* that
fragment from the syncer. The merge weight is tokens * (tokens / steps) = tokens^2 / steps:
quantity (tokens) times quality (tokens per step, i.e. batch size).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def token_weight(tokens: int, steps: int) -> float:
    """tokens^2 / steps; zero when no step was taken."""
    if steps <= 0 or tokens <= 0:
        return 0.0
    return float(tokens) * float(tokens) / float(steps)


@dataclass
class FragmentCounters:
    """Running totals, and for each fragment the totals when its count (re)started: a step
    costs O(1) whatever the number of fragments."""

    P: int
    total_steps: int = 0
    total_tokens: int = 0
    _steps0: list[int] = field(default_factory=list)
    _tokens0: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._steps0 = [0] * self.P
        self._tokens0 = [0] * self.P

    def add_step(self, tokens: int) -> None:
        self.total_steps += 1
        self.total_tokens += tokens

    def steps_of(self, p: int) -> int:
        return self.total_steps - self._steps0[p]

    def tokens_of(self, p: int) -> int:
        return self.total_tokens - self._tokens0[p]

    @property
    def steps(self) -> list[int]:
        return [self.steps_of(p) for p in range(self.P)]

    @property
    def tokens(self) -> list[int]:
        return [self.tokens_of(p) for p in range(self.P)]

    def reset(self, p: int, steps: int = 0, tokens: int = 0) -> None:
        """Fragment p's count restarts at (`steps`, `tokens`)."""
        self._steps0[p] = self.total_steps - steps
        self._tokens0[p] = self.total_tokens - tokens

    def weight(self, p: int) -> float:
        return token_weight(self.tokens_of(p), self.steps_of(p))

    def state_dict(self) -> dict:
        return {"total": (self.total_steps, self.total_tokens), "start": (list(self._steps0),
                list(self._tokens0))}  # fmt: skip

    def load_state_dict(self, st: dict) -> None:
        if len(st["start"][0]) != self.P:
            raise ValueError(f"counters of {len(st['start'][0])} fragments, expected {self.P}")
        self.total_steps, self.total_tokens = st["total"]
        self._steps0, self._tokens0 = list(st["start"][0]), list(st["start"][1])
