"""When a pulled round closes (the pull schedule).

At a tick the syncer pulls fragment p from every listening learner. Each answers at its next
step boundary, so within one of its own step times, and the answer takes about `sync` (the
measured upload time, grace.py) to arrive. The round therefore stays open

    answer window = min(slowest + 2 * sync, tau * step + sync)

after the pull (the second `sync` is margin for the jitter of a busy host: on 2 cores with 4
learners, one sync less left a fifth of the rounds to a single late answer), and closes
earlier once every listening learner has answered. `slowest` is
the largest step time among the listening learners' own reports; a learner slower than
tau steps is not waited for: an answer that arrives after its round closed is merged as
with push (quorum, then the grace window), and when nobody answered within the window the
first answer closes the round at once (a learner waiting for its answer is not kept waiting).
Waiting for the slowest matters: with a quorum of 1, a round of one late straggler sets the
global fragment from its stale work alone.

Measured before this rule (the grace window, counted from the first answer): a pull every
step gave 2.3 rounds per pull on 4 learners of one speed, so each fragment was merged about
every 10 steps instead of every H, most rounds merging one or two learners (BENCHMARKS.md,
the peer benchmark).
"""

from __future__ import annotations

import math

from atoll.core.checks import STEP_TIME_MAX
from atoll.core.grace import SPAN, GracePolicy
from atoll.core.messages import Progress

UPLOAD_FLOOR_S = 1.0  # an average upload below this is never called a link bottleneck


def mean_step_time(prev: tuple[int, float] | None, steps: int, work_s: float, own: float) -> float:
    """The mean time of the steps a report covers (the one rule, for the learner that reports
    and the syncer that reads): the work (step-seconds) since the previous report `prev`
    (its steps, work) over the steps since, when it covers more than one step and the work
    grew; else the learner's `own` measure (one step, or a first report)."""
    if prev is not None and steps - prev[0] > 1 and work_s > prev[1]:
        return (work_s - prev[1]) / (steps - prev[0])
    return own


class PullRounds:
    def __init__(self, P: int) -> None:
        self.deadline = [math.inf] * P  # when the open pull of each fragment closes
        self.step_of: dict[str, float] = {}  # learner -> its reported step time
        self.uploads: dict[str, float] = {}  # learner -> average upload time (EMA 0.2)
        self.slow_links: set[str] = set()  # learners whose link is the bottleneck now
        self.reported: dict[str, tuple[int, float]] = {}  # learner -> (steps, work_s) reported

    def measure(self, msg: Progress) -> tuple[float, int] | None:
        """A learner's step report (`msg.step` steps since it joined, `msg.work_s` their
        seconds): its mean step time and the steps it covers (None: no new step, or a mean
        beyond STEP_TIME_MAX); the mean is the learner's reported step time (one step, or its
        first report), or its work since its previous report over the steps it covers."""
        prev = self.reported.get(msg.learner)
        k = msg.step - (prev[0] if prev else 0)
        if k <= 0:
            return None
        work = msg.work_s if math.isfinite(msg.work_s) else (prev[1] if prev else 0.0)
        mean = mean_step_time(prev, msg.step, work, msg.step_time)
        self.reported[msg.learner] = (msg.step, work)
        if not 0 < mean <= STEP_TIME_MAX:
            return None
        return mean, k

    def rejoined(self, learner: str) -> None:
        """Its step count starts over (it reports steps since it joined)."""
        self.reported.pop(learner, None)

    def upload(
        self, learner: str, seconds: float, grace: GracePolicy
    ) -> tuple[float, float] | None:
        """A contribution took `seconds` from its step boundary to the syncer. Returns the
        learner's average upload time and the overlap when its link has just become the
        bottleneck: uploads slower than the tau-step overlap and than UPLOAD_FLOOR_S, so no
        answer can come back in time (again only after it fell below half of the overlap)."""
        ema = self.uploads.get(learner)
        ema = seconds if ema is None else 0.8 * ema + 0.2 * seconds
        self.uploads[learner] = ema
        if grace.step.value is None:
            return None
        overlap = grace.tau * grace.step.value
        # and at least a second: uploads of a few tenths on loopback are the host's busy CPU
        # (atoll demo on 2 cores: 0.2 s against a 0.1 s overlap), not a link
        if ema > max(overlap, UPLOAD_FLOOR_S) and learner not in self.slow_links:
            self.slow_links.add(learner)
            return ema, overlap
        if ema < overlap / 2:
            self.slow_links.discard(learner)
        return None

    def observe(self, learner: str, step_time: float) -> None:
        self.step_of[learner] = step_time

    def forget(self, learner: str) -> None:
        self.reported.pop(learner, None)
        self.step_of.pop(learner, None)
        self.uploads.pop(learner, None)
        self.slow_links.discard(learner)

    def window(self, grace: GracePolicy, listening: set[str]) -> float:
        step = grace.step.value or 1.0
        times = [self.step_of[x] for x in listening if x in self.step_of]
        slowest = min(max(times, default=step), SPAN * step)
        sync = grace.sync.value or 0.0
        return min(slowest + 2 * sync, grace.tau * step + sync)

    def open(self, p: int, now: float, grace: GracePolicy, listening: set[str]) -> float:
        """Fragment p was pulled at `now`: its round's deadline."""
        self.deadline[p] = now + self.window(grace, listening)
        return self.deadline[p]

    def waiting(self, p: int) -> bool:
        """A pull of fragment p is open (its round has not closed since)."""
        return self.deadline[p] < math.inf

    def due(self, p: int, now: float) -> bool:
        return now >= self.deadline[p]

    def closed(self, p: int) -> None:
        self.deadline[p] = math.inf
