"""Contributions waiting to go up: newest per fragment (a newer send of a fragment supersedes a
queued one and takes over its work), oldest first, with the counts that the status reports
carry."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from atoll.core.learner import supersede
from atoll.core.messages import Contribution, Outgoing


@dataclass(frozen=True)
class Pending:
    """A queued contribution: as handed over, and once encoded (a retry sends the same frame:
    its error-feedback residual is already spent)."""

    outgoing: Outgoing
    encoded: Contribution | None = None

    @property
    def fragment(self) -> int:
        return self.outgoing.fragment


class SendQueue:
    """Contributions waiting to go, newest per fragment, oldest first; the counts that the
    status reports carry (numbered under the same lock)."""

    def __init__(self) -> None:
        self._out: OrderedDict[int, Pending] = OrderedDict()
        self._cv = threading.Condition()
        self._closed = False
        self.in_flight = 0
        self.received = 0  # contributions handed over by the training side
        self.generation = 0  # newest heal the training side reported
        self._seq = 0

    def put(self, items: list[Outgoing]) -> None:
        with self._cv:
            for o in items:
                self.received += 1
                old = self._out.pop(o.fragment, None)
                if old is not None:  # the newest send of a fragment goes in its place
                    o = supersede(old.outgoing, o)
                self._out[o.fragment] = Pending(o)
            self._cv.notify()

    def requeue(self, item: Pending) -> None:
        """Back to the front, unless a newer send of its fragment is queued."""
        with self._cv:
            if item.fragment not in self._out:
                self._out[item.fragment] = item
                self._out.move_to_end(item.fragment, last=False)
                self._cv.notify()

    def reset(self, generation: int) -> None:
        """A heal: drop what an older generation queued."""
        with self._cv:
            self.generation = max(self.generation, generation)
            old = [p for p, i in self._out.items() if i.outgoing.generation < self.generation]
            for p in old:
                del self._out[p]

    def take(self) -> Pending | None:
        """The oldest queued contribution, waiting for one (None once closed); it counts as in
        flight until `done`."""
        with self._cv:
            while not self._out and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            _, item = self._out.popitem(last=False)
            self.in_flight = 1
            return item

    def done(self) -> None:
        with self._cv:
            self.in_flight = 0

    def counts(self) -> tuple[int, int, int]:
        """(queued including in flight, received, a new report number)."""
        with self._cv:
            self._seq += 1
            return len(self._out) + self.in_flight, self.received, self._seq

    def wake_all(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
