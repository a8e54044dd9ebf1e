"""The run-level rules: the token budget that ends a run (the syncer's side, `TokenBudget`, and
each learner's, `BudgetShare`), and the synchronized start of the learners expected at its
beginning.

A run with a token budget ends when the learners' counted tokens reach it: the syncer asks
every learner to stop in its heartbeat replies, and tells each how much remains and how many
learners share it. A learner stops when the syncer says so, or, the only live learner, once it
has trained what was left; with others live, once it has trained its share of what was left it
asks at once (a heartbeat now, not up to `heartbeat_s` later) and trains on: the run trains at
least its budget and ends within a few steps of it.
A run that expects `expect` learners gives them one start time, `delay_s` after the last of
them joined, so that they start their first step together.

When a run with a budget is over (`RunEnd`, asked by `SyncerProtocol.run_over`): the budget is
spent and every learner has flushed (each learner ends its session after its final flush and
final heartbeat; the last one to leave ends the run), or the window after the budget has
passed. That window is fixed when the budget is spent: `after_s` (the live syncer's
`lost_after_s`, within which a learner with a session has heard the stop, plus its
`finish_window_s`, within which a learner still connected sends its final flush, has it merged
and leaves) plus the pull's answer window then (pacing.py: the slowest listening learner's step
and its upload time). A vanished learner is dropped after `lost_after_s` and so ends nothing
later; one that never flushes, or joins after the budget, holds the run at most until then.
"""

from __future__ import annotations

import math
from collections.abc import Set
from dataclasses import dataclass

from atoll.core.events import Event, RunOver
from atoll.core.messages import RunDeadline, SetTimer


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
class RunEnd:
    """The end of a run with a token budget (module docstring). No budget: never over."""

    budget: TokenBudget
    after_s: float = 0.0
    spent_at: float | None = None
    deadline: float = math.inf  # the end of the window after the budget
    left: bool = False  # a learner's session ended since the budget was spent
    given: bool = False  # the RunOver event was given

    @property
    def spent(self) -> bool:
        """The budget is spent (the learners are told to stop)."""
        return self.spent_at is not None

    def on_tokens(self, now: float, total: int, window: float, live: Set[str]) -> list:
        """`counted`, as the protocol's outputs: the deadline's timer, and the end at once when
        no learner is left."""
        if not self.counted(now, total, window):
            return []
        return [SetTimer(self.deadline, RunDeadline()), *self.check(now, live)]

    def check(self, now: float, live: Set[str]) -> list[Event]:
        """The `RunOver` event, once, when the run is over at `now` (`over`)."""
        if self.given or not self.over(now, len(live)):
            return []
        self.given = True
        why = "flushed" if not live and self.left else "window"
        left = sorted(live) if why == "window" else None
        return [Event(now, "syncer", RunOver(why, round(now - (self.spent_at or now), 3), left))]

    def counted(self, now: float, total_tokens: int, answer_window: float) -> bool:
        """The run has counted `total_tokens` at `now`: True when that spends the budget (once);
        the window after it is then `after_s` + `answer_window`."""
        if self.spent_at is not None or not self.budget.stop_requested(total_tokens):
            return False
        self.spent_at = now
        self.deadline = now + self.after_s + max(answer_window, 0.0)
        return True

    def session_ended(self) -> None:
        """A learner left (its final flush sent, or lost)."""
        if self.spent_at is not None:
            self.left = True

    def over(self, now: float, live: int) -> bool:
        """Whether the run is over at `now` with `live` learner sessions: the budget spent, and
        every learner gone since (none live, one at least left after the budget), or the
        window after the budget passed."""
        if self.spent_at is None:
            return False
        return (live == 0 and self.left) or now >= self.deadline


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
    or when the syncer's last answer said it was the only live learner and it has trained what
    that answer said was left. With others live, once it has trained its share of what was left
    (the remaining tokens over the live learners, counted from the tokens that answer carried)
    it asks again at once, once per answer, and trains on.

    (Learners used to stop on their share: answers of different ages, one learner's taken
    before the others had trained theirs, could add up to less than the budget, and a run under
    load ended a step short of it. Alone, the share is the whole rest: it cannot fall short.)"""

    stopped: bool = False
    share: tuple[int, float] | None = None  # (tokens at the answer, tokens left to it)
    alone: bool = False  # the answer counted no other live learner
    asked: bool = False  # this answer's share is trained and a heartbeat asked for

    def answer(self, tokens: int, remaining: int, live: int) -> None:
        self.share = (tokens, remaining / max(live, 1))
        self.alone = live <= 1
        self.asked = False

    def stop(self) -> None:
        self.stopped = True

    def _trained(self, tokens: int) -> bool:
        share = self.share
        return share is not None and tokens - share[0] >= share[1]

    def spent(self, tokens: int) -> bool:
        """Whether a learner that has trained `tokens` in all should stop."""
        return self.stopped or (self.alone and self._trained(tokens))

    def ask(self, tokens: int) -> bool:
        """Whether to ask the syncer now (a heartbeat at once): a learner that has trained
        `tokens` in all has trained its share of the last answer, and has not asked since."""
        if self.stopped or self.alone or self.asked or not self._trained(tokens):
            return False
        self.asked = True
        return True

    def state_dict(self) -> dict:
        return {"stopped": self.stopped, "share": self.share, "alone": self.alone}

    def load_state_dict(self, st: dict) -> None:
        self.stopped = bool(st.get("stopped", False))
        share = st.get("share")
        self.share = None if share is None else (int(share[0]), float(share[1]))
        self.alone = bool(st.get("alone", False))


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
