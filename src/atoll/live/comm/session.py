"""The state a learner's communication threads share: the session with the syncer (what its
newest Welcome said), the training side's newest step state, and the threads' flags."""

from __future__ import annotations

import threading

from atoll.core import codec
from atoll.live.comm.messages import StepState
from atoll.wire import atoll_pb2 as pb
from atoll.wire import convert

NO_REPORT = 1 << 62  # `StepReports.since` when no step report is due


class Session:
    """What the newest Welcome said (the down thread writes it; the others read it)."""

    def __init__(self) -> None:
        self.encoder: codec.ContributionEncoder | None = None  # made at the first Welcome
        self.epoch = ""
        self.schedule = ""
        self.chunk_bytes = 256 * 1024
        self.max_bytes = 1 << 30
        self.numel: dict[int, int] = {}  # fragment -> values
        self.joins = 0  # welcomes received

    def welcome(self, w: pb.Welcome) -> None:
        """Take a (re)join's settings; the encoder is made once (its residuals carry over)."""
        self.epoch = w.epoch
        self.chunk_bytes = w.chunk_bytes or self.chunk_bytes
        self.max_bytes = w.max_fragment_bytes or self.max_bytes
        cfg = convert.learner_config_from_welcome(w)
        self.schedule = cfg.schedule
        self.numel = {f.index: f.numel for f in convert.plan_from_welcome(w).fragments}
        if self.encoder is None:
            self.encoder = codec.ContributionEncoder(cfg.codec, cfg.group, cfg.error_feedback)

    def fragment_sizes(self) -> list[int]:
        """Values per fragment, in plan order."""
        return [self.numel[p] for p in sorted(self.numel)]


class Flags:
    """`connected`: a Welcome of the current Join stream was usable; `closing`: every thread
    returns."""

    def __init__(self) -> None:
        self.connected = threading.Event()
        self.closing = threading.Event()


class StepReports:
    """The training side's newest step state, and when a heartbeat must go at once
    (`beat_now`): heartbeats carry the step reports that start the syncer's pull clock, so the
    first step after a (re)join, and the opening of the Pulls stream, are reported at once,
    not up to `heartbeat_s` later."""

    def __init__(self) -> None:
        self.state: StepState | None = None
        self.beat_now = threading.Event()
        self.since = NO_REPORT  # steps at the last (re)join

    def update(self, st: StepState) -> None:
        self.state = st
        if st.steps > self.since:  # the first step since (re)joining: report it at once
            self.since = NO_REPORT
            self.beat_now.set()
        if st.ask:  # its share of the budget's rest trained: the syncer is asked at once
            self.beat_now.set()

    def rejoined(self) -> None:
        """A Welcome: the next step is to be reported at once."""
        st = self.state
        self.since = st.steps if st is not None else 0
