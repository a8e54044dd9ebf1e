"""`Comm`: a learner's communication side, its four threads composed.

  - down (downlink.py): the Join stream on the bulk channel: welcome, heal, broadcast updates;
  - up (uplink.py): contributions, encoded here, then PushOne or a Push stream;
  - beat, ctl (control.py): heartbeats and the Pulls stream on the control channel.

It takes the training side's messages through `command` (atoll.live.learner.messages: down)
and hands everything the training side must see to `sink` (up messages).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from atoll.core.events import ThreadDied
from atoll.live.comm.control import Control
from atoll.live.comm.downlink import Downlink
from atoll.live.comm.link import NO_REPORT, Link
from atoll.live.comm.uplink import Uplink
from atoll.live.learner.messages import (
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
from atoll.threads import guarded


class Comm:
    def __init__(self, opts: CommOptions, sink: Callable[[FromComm], None]) -> None:
        self.link = Link(opts, sink)
        self.down = Downlink(self.link)
        self.up = Uplink(self.link)
        self.control = Control(self.link)
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
        self.link.events.record(self.link.id, ThreadDied(thread=name, error=repr(exc)[:500]))
        self.link.sink(CommFailed(f"communication thread {name} died: {exc!r}"[:1000]))

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def command(self, msg: ToComm) -> bool:
        """Apply one message of the training side; False when it asks the comm to close."""
        link = self.link
        match msg:
            case StepState():
                self._on_step(msg)
            case Reset(generation):  # the learner healed: older contributions are obsolete
                link.queue.reset(generation)
            case RequestHeal():
                link.request_heal()
            case Finishing():  # the training side waits for the queue to drain
                link.finishing = True
                link.status()
            case BeatOnce():
                counted = self.control.beat_once()
                link.status()  # the last reading of the wire counters, after every answer
                link.sink(BeatDone(counted))
            case Close():
                return False
            case Start():
                pass  # options: read by the child process before it makes this object
        return True

    def _on_step(self, st: StepState) -> None:
        link = self.link
        link.state = st
        if st.steps > link.beat_steps:  # the first step since (re)joining: report it at once
            link.beat_steps = NO_REPORT
            link.beat_now.set()
        if st.submits:
            for s in st.submits:
                assert s.vector is None, "a vector still to be taken from its slot"
            link.queue.put([s.outgoing for s in st.submits])

    def fragment_sizes(self) -> list[int]:
        """Values per fragment, in plan order (from the newest Welcome)."""
        numel = self.link.numel
        return [numel[p] for p in sorted(numel)]

    def close(self) -> None:
        self.link.close()
        for t in self._threads:
            if t is not threading.current_thread() and t.is_alive():
                t.join(timeout=2.0)
        self.link.close_channels()
