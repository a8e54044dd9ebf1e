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
    P: int
    steps: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.steps = [0] * self.P
        self.tokens = [0] * self.P

    def add_step(self, tokens: int) -> None:
        for p in range(self.P):
            self.steps[p] += 1
            self.tokens[p] += tokens

    def reset(self, p: int, steps: int = 0, tokens: int = 0) -> None:
        self.steps[p] = steps
        self.tokens[p] = tokens

    def weight(self, p: int) -> float:
        return token_weight(self.tokens[p], self.steps[p])
