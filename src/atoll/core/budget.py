"""The run-level rules: the token budget that ends a run (the syncer's side, `TokenBudget`, and
each learner's, `BudgetShare`), and the synchronized start of the learners expected at its
beginning.

A run with a token budget ends when the learners' counted tokens reach it: the syncer asks
every learner to stop in its heartbeat replies, and tells each how much remains and how many
learners share it (so that a learner can pace its last steps). A run that expects `expect`
learners gives them one start time, `delay_s` after the last of them joined, so that they
start their first step together.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BeatAnswer:
    """The syncer's answer to a heartbeat: stop (the budget is spent), whether there is a
    budget, the tokens that remain of it, and the live learners that share it (at least 1)."""

    stop: bool
    budget: bool
    remaining: int
    live: int


@dataclass(frozen=True)
class TokenBudget:
    """`budget` tokens for the whole run; 0 (or less): no budget, the run goes on until
    stopped."""

    budget: int

    def stop_requested(self, total_tokens: int) -> bool:
        return self.budget > 0 and total_tokens >= self.budget

    def answer(self, total_tokens: int, live: int) -> BeatAnswer:
        """The heartbeat answer when the run has counted `total_tokens` and `live` learners
        have a session."""
        return BeatAnswer(
            stop=self.stop_requested(total_tokens),
            budget=self.budget > 0,
            remaining=max(self.budget - total_tokens, 0),
            live=max(live, 1),
        )


@dataclass
class StartBarrier:
    """The run's start time: set once, `delay_s` after the join that brought the learners to
    `expect` (0: no synchronized start). `start_at` may come from an earlier process."""

    expect: int
    delay_s: float = 0.5
    start_at: float | None = None

    def joined(self, now: float, count: int) -> float | None:
        """A learner joined at `now`, `count` learners now joined: the start time (None while
        fewer than `expect` have joined, or without a synchronized start)."""
        if self.expect and self.start_at is None and count >= self.expect:
            self.start_at = now + self.delay_s
        return self.start_at


@dataclass
class BudgetShare:
    """A learner's side of the token budget: it stops when the syncer says the budget is spent,
    or once it has trained its share of what the syncer's last answer said was left (the
    remaining tokens over the live learners), counted from the tokens that answer carried."""

    stopped: bool = False
    share: tuple[int, float] | None = None  # (tokens at the answer, tokens left to it)

    def answer(self, tokens: int, remaining: int, live: int) -> None:
        self.share = (tokens, remaining / max(live, 1))

    def stop(self) -> None:
        self.stopped = True

    def spent(self, tokens: int) -> bool:
        """Whether a learner that has trained `tokens` in all should stop."""
        share = self.share
        return self.stopped or (share is not None and tokens - share[0] >= share[1])

    def state_dict(self) -> dict:
        return {"stopped": self.stopped, "share": self.share}

    def load_state_dict(self, st: dict) -> None:
        self.stopped = bool(st.get("stopped", False))
        share = st.get("share")
        self.share = None if share is None else (int(share[0]), float(share[1]))
