"""What waits to go down to each learner: its broadcast updates (Join stream) and its pulls
(Pulls stream). Only queues and wake-ups live here; which update replaces which is the core's
decision (`SyncerProtocol.coalesce`).

Every queue is bounded, whatever the learner does (a slow reader, a stream never read):
updates: per fragment a chain of deltas no larger than the fragment in fp32, or one update
(at most the model's size in all), pulls one per fragment (a newer pull of a fragment replaces
the older)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from atoll.core.messages import FragmentUpdate, Pull

Coalesce = Callable[[tuple[FragmentUpdate, ...], FragmentUpdate], tuple[FragmentUpdate, ...]]


@dataclass
class Session:
    """One learner's Join stream: updates not yet sent (per fragment, in order)."""

    learner: str
    incarnation: str
    last_seen: float
    cond: threading.Condition = field(default_factory=threading.Condition)
    updates: OrderedDict[int, tuple[FragmentUpdate, ...]] = field(default_factory=OrderedDict)
    closed: bool = False
    finishing: bool = False  # its final beat came: the stream's end is a finish, not a loss

    def put_update(self, u: FragmentUpdate, coalesce: Coalesce) -> None:
        """Queue an update; with updates of the same fragment still queued, the core says
        what goes instead (`coalesce`: a chain of deltas, or the newest in full)."""
        with self.cond:
            old = self.updates.pop(u.fragment, None)
            self.updates[u.fragment] = (u,) if old is None else coalesce(old, u)
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()

    def get(self, timeout: float) -> FragmentUpdate | None:
        with self.cond:
            if not (self.updates or self.closed):
                self.cond.wait(timeout)
            if self.updates:
                p, chain = self.updates.popitem(last=False)
                if len(chain) > 1:  # the rest of this fragment's chain goes next
                    self.updates[p] = chain[1:]
                    self.updates.move_to_end(p, last=False)
                return chain[0]
            return None


@dataclass
class Control:
    """One learner's Pulls stream: pulls waiting to go down it."""

    learner: str
    incarnation: str
    cond: threading.Condition = field(default_factory=threading.Condition)
    pulls: dict[int, Pull] = field(default_factory=dict)  # fragment -> its newest pull
    closed: bool = False
    opened: float = field(default_factory=time.time)

    def put(self, pull: Pull) -> None:
        with self.cond:
            self.pulls.pop(pull.fragment, None)
            self.pulls[pull.fragment] = pull
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()

    def get(self, timeout: float) -> list[Pull]:
        with self.cond:
            if not (self.pulls or self.closed):
                self.cond.wait(timeout)
            out, self.pulls = list(self.pulls.values()), {}
            return out
