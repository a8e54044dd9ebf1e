"""`Comm`: a learner's communication side, its four threads composed from the parts they
share; each thread is given the options and the parts below that every thread uses
(part.py), and the few others it uses:

  - `Session` (session.py): what the syncer's newest Welcome said; `StepReports`: the training
    side's newest step state; `Flags`: connected, closing;
  - `Channels` (channels.py): the bulk and control gRPC channels, their open calls;
  - `StatusReporter` (status.py): messages and counters to the training side;
  - `SendQueue` (sendqueue.py): contributions waiting to go up.

The threads:

  - down (downlink.py): the Join stream on the bulk channel: welcome, heal, broadcast updates;
  - up (uplink.py): contributions, encoded here, then PushOne or a Push stream;
  - beat, ctl (control.py): heartbeats and the Pulls stream on the control channel.

It takes the training side's messages through `command` (atoll.live.comm.messages: down)
and hands everything the training side must see to `sink` (up messages).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from atoll.core.events import ThreadDied
from atoll.eventlog import EventLog
from atoll.live.comm.channels import Channels
from atoll.live.comm.control import Control
from atoll.live.comm.downlink import Downlink
from atoll.live.comm.faults import LinkFaults
from atoll.live.comm.messages import (
    BeatDone,
    BeatOnce,
    Close,
    CommFailed,
    CommOptions,
    Finishing,
    FromComm,
    RequestHeal,
    Reset,
    Start,
    StepState,
    ToComm,
)
from atoll.live.comm.sendqueue import SendQueue
from atoll.live.comm.session import Flags, Session, StepReports
from atoll.live.comm.status import StatusReporter
from atoll.live.comm.uplink import Uplink
from atoll.threads import guarded


class Comm:
    def __init__(self, opts: CommOptions, sink: Callable[[FromComm], None]) -> None:
        self.id = opts.learner_id
        self.events = EventLog(opts.events_path)
        self.queue = SendQueue()
        self.faults = LinkFaults(opts.faults_path)
        self.session = Session()
        self.steps = StepReports()  # the training side's newest
        self.flags = Flags()
        self.reporter = StatusReporter(
            sink, self.queue, self.flags.connected, opts.address, opts.status_interval_s
        )
        self.channels = Channels(opts)
        # what every thread is given (atoll.live.comm.part), then the parts it adds
        common = (opts, self.session, self.channels, self.flags, self.reporter, self.faults)
        self.down = Downlink(*common, self.steps, self.events)
        self.up = Uplink(*common, self.queue, self.events)
        self.control = Control(*common, self.steps)
        self._threads = [
            guarded(f"atoll-{name}", fn, self._died)
            for name, fn in (
                ("down", self.down.run),
                ("up", self.up.run),
                ("beat", self.control.run_beats),
                ("ctl", self.control.run_pulls),
            )
        ]

    def _died(self, name: str, exc: BaseException) -> None:
        """A thread of ours raised: the training side is told (it raises `CommError`)."""
        self.events.record(self.id, ThreadDied(thread=name, error=repr(exc)[:500]))
        self.reporter.send(CommFailed(f"communication thread {name} died: {exc!r}"[:1000]))

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def command(self, msg: ToComm) -> bool:
        """Apply one message of the training side; False when it asks the comm to close."""
        match msg:
            case StepState():
                self._on_step(msg)
            case Reset(generation):  # the learner healed: older contributions are obsolete
                self.queue.reset(generation)
            case RequestHeal():
                self.channels.request_heal()
            case Finishing():  # the training side waits for the queue to drain
                self.reporter.finishing = True
                self.reporter()
            case BeatOnce():
                counted = self.control.beat_once()
                self.reporter()  # the last reading of the wire counters, after every answer
                self.reporter.send(BeatDone(counted))
            case Close():
                return False
            case Start():
                pass  # options: read by the child process before it makes this object
        return True

    def _on_step(self, st: StepState) -> None:
        self.steps.update(st)
        if st.submits:
            for s in st.submits:
                assert s.vector is None, "a vector still to be taken from its slot"
            self.queue.put([s.outgoing for s in st.submits])

    def fragment_sizes(self) -> list[int]:
        """Values per fragment, in plan order (from the newest Welcome)."""
        return self.session.fragment_sizes()

    def close(self) -> None:
        """Wake every thread and end both streams; wait for the threads; close the channels."""
        self.flags.closing.set()
        self.steps.beat_now.set()
        self.queue.wake_all()
        self.channels.cancel_calls()
        for t in self._threads:
            if t is not threading.current_thread() and t.is_alive():
                t.join(timeout=2.0)
        self.channels.close()
