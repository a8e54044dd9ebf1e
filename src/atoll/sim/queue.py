"""The virtual-time driver's queue: what happens when, each item a typed record.

Items due at the same time come out in the order they were pushed (a sequence number breaks
ties), so a run is the same whatever the items hold. Items addressed to a learner carry its
process's `incarnation`: one addressed to (or sent by) a process that has since died is
dropped where it is read (sim/decoupled.py)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from atoll.core.messages import TimerKey


# what is due (each a frozen record; the docstring above says how they are read)
@dataclass(frozen=True)
class Timer:  # a syncer timer, set by the protocol of syncer process `epoch`
    key: TimerKey
    epoch: int


@dataclass(frozen=True)
class FaultDue:  # the scenario's fault number `index` (sim/faults.py's timeline)
    index: int


@dataclass(frozen=True)
class SyncerUp:  # a killed syncer's restart
    pass


@dataclass(frozen=True)
class ToLearner:  # addressed to one process of a learner
    learner: str
    incarnation: int


@dataclass(frozen=True)
class StepDone(ToLearner):  # its step of `dt` seconds ends
    dt: float


@dataclass(frozen=True)
class Up(ToLearner):  # its contribution, progress or heal request reaches the syncer
    message: Any


@dataclass(frozen=True)
class Down(ToLearner):  # a message of syncer process `epoch` reaches it
    message: Any
    epoch: int


@dataclass(frozen=True)
class Fail(ToLearner):  # its process dies, and is back after `downtime` seconds
    downtime: float


@dataclass(frozen=True)
class Recover(ToLearner):  # a failed learner's new process starts
    pass


Item = Timer | FaultDue | SyncerUp | StepDone | Up | Down | Fail | Recover


@dataclass
class Queue:
    _heap: list[tuple[float, int, Item]] = field(default_factory=list)
    _seq: Any = field(default_factory=itertools.count)

    def push(self, t: float, item: Item) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), item))

    def pop(self) -> tuple[float, Item]:
        t, _, item = heapq.heappop(self._heap)
        return t, item

    def take(self, due: float, cls: type) -> list[tuple[float, Item]]:
        """The items of class `cls` due at `due` or before, taken out, in queue order."""
        taken = sorted(x for x in self._heap if isinstance(x[2], cls) and x[0] <= due)
        if taken:
            self._heap = [x for x in self._heap if not (isinstance(x[2], cls) and x[0] <= due)]
            heapq.heapify(self._heap)
        return [(t, item) for t, _, item in taken]

    def __iter__(self) -> Iterator[tuple[float, Item]]:
        """Every item (not taken out), in queue order."""
        return ((t, item) for t, _, item in sorted(self._heap))

    def __bool__(self) -> bool:
        return bool(self._heap)
