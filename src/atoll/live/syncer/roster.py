"""What a live syncer knows of each learner beyond its session, for the status page, the
`atoll syncer` view and the learner rows of `/status.json`: the island's size it said when it
joined, its steps (from its beats), the bytes it sent up (contributions taken) and was sent
down (updates and heals), the last update sent to it, its contributions merged and the
staleness of the newest, and how often its Join stream was reopened by the same incarnation
(a reconnect, not a restart).

Figures are per learner id across its incarnations, kept while the syncer process runs (not
persisted: a restarted syncer starts them again). Every call is made with the runtime's lock
held. Bounded: past MAX_ROWS learners, only those with a live session are kept.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import asdict, dataclass
from typing import Any

from atoll.core.events import Accepted, Event, RoundClosed

MAX_ROWS = 4096  # learners whose figures are kept (then: the live ones)


@dataclass
class LearnerFigures:
    incarnation: str = ""
    ranks: int = 1  # the island's size (1: one process)
    step: int = 0  # the current incarnation's steps, from its newest beat
    steps_before: int = 0  # the steps of its earlier incarnations
    bytes_in: int = 0  # contribution payload bytes taken
    bytes_out: int = 0  # update payload bytes sent down
    merged: int = 0  # contributions merged into rounds
    staleness: int = -1  # of the newest merged (-1: none yet)
    last: str = ""  # the newest update sent: "fragment@version"
    joins: int = 0
    reconnects: int = 0  # Join streams reopened by the same incarnation

    @property
    def steps(self) -> int:
        return self.steps_before + self.step

    def row(self) -> dict[str, Any]:
        """Its figures as a learner row of /status.json."""
        out = asdict(self)
        del out["incarnation"], out["steps_before"], out["step"]
        out["steps"] = self.steps
        return out


class Roster:
    def __init__(self) -> None:
        self.rows: dict[str, LearnerFigures] = {}

    def get(self, learner: str, live: Container[str] = ()) -> LearnerFigures:
        """`learner`'s figures (new ones past MAX_ROWS drop every learner not in `live`)."""
        r = self.rows.get(learner)
        if r is None:
            if len(self.rows) >= MAX_ROWS:
                self.rows = {k: v for k, v in self.rows.items() if k in live}
            r = self.rows[learner] = LearnerFigures()
        return r

    def joined(self, learner: str, incarnation: str, ranks: int, live: Container[str]) -> None:
        r = self.get(learner, live)
        if r.joins and r.incarnation == incarnation:
            r.reconnects += 1
        elif r.incarnation != incarnation:  # a new incarnation: the old one's steps are done
            r.steps_before += r.step
            r.step = 0
        r.incarnation, r.ranks, r.joins = incarnation, max(ranks, 1), r.joins + 1

    def beat(self, learner: str, incarnation: str, step: int) -> None:
        r = self.rows.get(learner)
        if r is not None and r.incarnation == incarnation:
            r.step = max(r.step, step)

    def sent(self, learner: str, fragment: int, version: int, nbytes: int) -> None:
        r = self.rows.get(learner)
        if r is not None:
            r.bytes_out += nbytes
            r.last = f"{fragment}@{version}"

    def observe(self, e: Event, live: Container[str]) -> None:
        """The protocol's events: contributions taken, and merged into a round."""
        match e.data:
            case Accepted(learner=lid, bytes=n):
                self.get(lid, live).bytes_in += n
            case RoundClosed(participants=ps, staleness=st):
                for lid, s in zip(ps, st, strict=False):
                    r = self.get(lid, live)
                    r.merged += 1
                    r.staleness = s

    def total_steps(self) -> int:
        return sum(r.steps for r in self.rows.values())
