"""What the parts of a learner's communication side share: the two channels, the session with
the syncer (what its newest Welcome said), the training side's newest step state, and the
status reports to the training side."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from atoll.core.codec import ContributionEncoder
from atoll.eventlog import EventLog
from atoll.live.comm.faults import LinkFaults
from atoll.live.comm.uplink import SendQueue
from atoll.live.comm.wire import WireCounter
from atoll.live.learner.messages import CommOptions, CommStatus, FromComm, StepState
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire.auth import call_metadata, open_channel

NO_REPORT = 1 << 62  # `beat_steps` when no step report is due


class Link:
    def __init__(self, opts: CommOptions, sink: Callable[[FromComm], None]) -> None:
        self.o = opts
        self.id = opts.learner_id
        self.sink = sink
        self.metadata = call_metadata(opts.run_id, opts.secret)
        self.events = EventLog(opts.events_path)
        self.queue = SendQueue()
        self.faults = LinkFaults(opts.faults_path)
        # the session, from the newest Welcome
        self.encoder: ContributionEncoder | None = None  # made at the first Welcome
        self.epoch = ""
        self.schedule = ""
        self.chunk_bytes = 256 * 1024
        self.max_bytes = 1 << 30
        self.numel: dict[int, int] = {}  # fragment -> values
        self.joins = 0  # welcomes received
        self.state: StepState | None = None  # the training side's newest
        self.connected = threading.Event()
        self.closing = threading.Event()
        self.lock = threading.Lock()  # the calls below and `force_heal`
        self.join_call: Any = None
        self.ctl_call: Any = None
        self.force_heal = False
        self.finishing = False  # the training side waits for the queue: report every send
        self.bytes_up = 0
        self.wire = WireCounter(opts.address)  # bytes on the wire (the kernel's TCP counters)
        self.reconnects = 0
        # heartbeats carry the step reports that start the syncer's pull clock: the first
        # step after a (re)join, and the opening of the Pulls stream, are reported at once,
        # not up to `heartbeat_s` later
        self.beat_now = threading.Event()
        self.beat_steps = NO_REPORT  # steps at the last (re)join
        self.status_at = 0.0  # monotonic time of the last status report
        self._status_seq = 0
        self.bulk = open_channel(opts.address, "bulk", opts.tls_ca)
        self.control = open_channel(opts.address, "control", opts.tls_ca)
        self.bulk_stub = pbg.SyncerStub(self.bulk)
        self.control_stub = pbg.SyncerStub(self.control)

    def status(self, stop: bool = False, budget: tuple[int, int, int] | None = None) -> None:
        """Report the counters to the training side (numbered: reports from different threads
        may overtake each other)."""
        self.status_at = time.monotonic()
        queued, received, seq = self.queue.counts()
        wire = self.wire.read(fresh=stop or self.finishing)
        self.sink(
            CommStatus(
                seq=seq,
                connected=self.connected.is_set(),
                bytes_up=self.bytes_up,
                reconnects=self.reconnects,
                queued=queued,
                received=received,
                stop=stop,
                budget=budget,
                wire=wire,
            )
        )

    def cancel_join(self) -> None:
        """End the Join stream (the down thread then reconnects)."""
        with self.lock:
            call = self.join_call
        if call is not None:
            call.cancel()

    def request_heal(self) -> None:
        with self.lock:
            self.force_heal = True
        self.cancel_join()

    def close(self) -> None:
        """Wake every thread and end both streams (the threads then return)."""
        self.closing.set()
        self.beat_now.set()
        self.queue.wake_all()
        with self.lock:
            calls = (self.join_call, self.ctl_call)
        for call in calls:
            if call is not None:
                call.cancel()

    def close_channels(self) -> None:
        self.bulk.close()
        self.control.close()
