"""What the communication side tells the training side: its messages, and the status reports
(the counters: queue, bytes, reconnects, the bytes on the wire), numbered because reports from
different threads may overtake each other."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from atoll.live.comm.messages import CommStatus, FromComm
from atoll.live.comm.sendqueue import SendQueue
from atoll.live.comm.wire import WireCounter


class StatusReporter:
    def __init__(
        self,
        sink: Callable[[FromComm], None],
        queue: SendQueue,
        connected: threading.Event,
        address: str,
        interval_s: float,
    ) -> None:
        self._sink = sink
        self._queue = queue
        self._connected = connected
        self._interval_s = interval_s
        self.wire = WireCounter(address)  # bytes on the wire (the kernel's TCP counters)
        self.bytes_up = 0
        self.reconnects = 0
        self.finishing = False  # the training side waits for the queue: report every send
        self._at = 0.0  # monotonic time of the last report

    def send(self, msg: FromComm) -> None:
        """A message to the training side."""
        self._sink(msg)

    def __call__(self, stop: bool = False, budget: tuple[int, int, int] | None = None) -> None:
        """Report the counters; `stop`: the syncer ended the run; `budget`: its answer about
        the token budget (tokens at that heartbeat, remaining, live)."""
        self._at = time.monotonic()
        queued, received, seq = self._queue.counts()
        wire = self.wire.read(fresh=stop or self.finishing)
        self.send(
            CommStatus(
                seq=seq,
                connected=self._connected.is_set(),
                bytes_up=self.bytes_up,
                reconnects=self.reconnects,
                queued=queued,
                received=received,
                stop=stop,
                budget=budget,
                wire=wire,
            )
        )

    def after_send(self) -> None:
        """Each report costs the training thread a message to handle: one per interval, or
        after every send while it waits for the queue to drain."""
        if self.finishing or time.monotonic() >= self._at + self._interval_s:
            self()
