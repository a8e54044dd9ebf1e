"""Where the syncer's CPU goes: the thread CPU seconds of each step, counted by the driver
around what it calls (on /metrics as `atoll_syncer_cpu_seconds_total{step=...}`; read by
benchmarks/syncer_service.py). The protocol is not timed from inside: its outputs stay the
same run after run.

    prepare       a contribution's crc, decompression and measure (its receiving thread)
    contribution  `on_contribution` under the lock, when it closed no round
    close         a call that closed a round (merge, outer step, broadcast encode, history)
    tape          the tape record of each merge
    snapshot      taking and writing a snapshot
    heal          a fresh learner's heal encoded (and digested) before its join takes the lock
    send          the updates' messages on every learner's stream"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from atoll.core.events import Event, RoundClosed

STEPS = ("prepare", "contribution", "close", "tape", "snapshot", "heal", "send")


class CpuSteps:
    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STEPS, 0.0)
        self._lock = threading.Lock()

    def add(self, step: str, seconds: float) -> None:
        with self._lock:
            self.seconds[step] += seconds

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        t0 = time.thread_time()
        try:
            yield
        finally:
            self.add(step, time.thread_time() - t0)

    def protocol_call(self, t0: float, outputs: list) -> None:
        """A protocol call that began at thread time `t0`: a close if it closed a round."""
        closed = any(isinstance(o, Event) and isinstance(o.data, RoundClosed) for o in outputs)
        self.add("close" if closed else "contribution", time.thread_time() - t0)

    def read(self) -> dict[str, float]:
        with self._lock:
            return dict(self.seconds)
