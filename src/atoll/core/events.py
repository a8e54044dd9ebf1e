"""The one event stream: a closed set of typed records, written by both drivers.

Every component emits `Event(t, source, record)`; metrics (atoll.metrics), logs
(atoll.eventlog) and reports read them. `t` is virtual seconds in the simulator and wall-clock
seconds in a live run; `source` is "syncer", "launcher" or a learner id. On disk an event is
`{"t", "kind", "source", "data"}`; fields left at None are not written.

This module is the whole vocabulary: a kind not defined here cannot be written
(`Event.make`, reading a log, raises on one), and a record's fields are its dataclass fields.

Fields are each record's dataclass fields (below). Who writes which:
Protocol, syncer (atoll.core.syncer): joined, lost, accepted, refused, round_closed (a merge:
    participants, weights, staleness, scale, waits, bytes), run_over (the budget spent and
    every learner gone, or the window after it passed), merge_refused (a round dropped: its
    merge was not finite), link_bottleneck (a learner's uploads take longer than the overlap)
Protocol, learner (atoll.core.learner): healed, applied, blocked (a wait at a step boundary),
    heal_needed (an update that does not chain), push_refused (the syncer refused a send)
Drivers: sent, failed (lost_steps_s: work since its last send), rejoined; live learners:
    training (first step), step (every 50 steps and at the end: counters, wire bytes)
Live learner's communication side: comm_fatal, refused_by_syncer, final_beat_lost (the syncer
    never counted the final counters), push_failed, transfer_failed (an update that could not
    be received), disconnected, reconnected
Live syncer: syncer_started, syncer_stopped, restored, snapshot, seen_check, transfer_broken,
    auth_refused (count: refusals since the last one written), limit_reached, snapshot_failed,
    restore_failed (the state on disk cannot be restored: exit 65), disk_failed (the tape could
    not be written: the syncer exits 75, nothing of the round it would record is sent, and its
    supervisor restarts it from what is on disk)
Any process: thread_died (a background thread raised; the process then stops)
Launcher: run_started, run_ended, timeout, started, restarted, crashed, chaos
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

KINDS: dict[str, type[Record]] = {}


class Record:
    """The data of one event kind. Fields read as attributes, or as `record["field"]`."""

    KIND: ClassVar[str] = ""

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def to_dict(self) -> dict[str, Any]:
        """The fields, less those at a default of None (a None without a default is written:
        `Event.from_dict` needs every field that has no default)."""
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if v is not None or f.default is dataclasses.MISSING:
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out


def _kind(name: str):
    def wrap(cls: type) -> type:
        cls = dataclass(frozen=True)(cls)
        cls.KIND = name
        if name in KINDS:
            raise ValueError(f"event kind {name!r} defined twice")
        KINDS[name] = cls
        return cls

    return wrap


# -- protocol -------------------------------------------------------------------------------
@_kind("joined")
class Joined(Record):
    learner: str
    incarnation: str | None = None
    heal: bool | None = None


FINISHED = "finished"  # a Lost's `why` when the learner said its last beat first: a finish


@_kind("lost")
class Lost(Record):
    """A learner's session ended: lost (`why`: how), or finished (`why` FINISHED: its final
    beat came before its stream ended)."""

    learner: str
    why: str | None = None


@_kind("run_over")
class RunOver(Record):
    """The token budget is spent and the run is over (core/budget.py, `RunEnd`): every learner
    left after its final flush ("flushed"), or the window after the budget passed ("window",
    `left`: the learners still with a session)."""

    reason: str
    waited_s: float
    left: list[str] | None = None


@_kind("accepted")
class Accepted(Record):
    learner: str
    fragment: int
    seq: int
    bytes: int
    work_s: float


@_kind("refused")
class Refused(Record):
    learner: str
    fragment: int
    reason: str
    code: str | None = None


@_kind("round_closed")
class RoundClosed(Record):
    fragment: int
    version: int
    participants: list
    weights: list
    staleness: list
    quorum_wait_s: float
    grace_s: float
    bytes_in: int
    bytes_out: int
    scale: float = 1.0  # how far the merged delta moved Theta (core/merge.py, light rounds)


@_kind("merge_refused")
class MergeRefused(Record):
    fragment: int
    participants: list
    reason: str


@_kind("link_bottleneck")
class LinkBottleneck(Record):
    learner: str
    upload_s: float
    overlap_s: float


@_kind("healed")
class Healed(Record):
    versions: list | None = None
    incarnation: str | None = None
    since_start_s: float | None = None


@_kind("applied")
class Applied(Record):
    fragment: int
    version: int
    mode: str


# -- drivers: learners -------------------------------------------------------------------------
@_kind("sent")
class Sent(Record):
    fragment: int
    seq: int
    base_version: int
    bytes: int
    steps: int
    tokens: int


@_kind("blocked")
class Blocked(Record):
    wait_s: float


@_kind("failed")
class Failed(Record):
    lost_steps_s: float


@_kind("rejoined")
class Rejoined(Record):
    downtime_s: float


@_kind("training")
class Training(Record):
    incarnation: str
    since_start_s: float
    island: int = 1  # ranks training as this learner (an island of N processes)


@_kind("step")
class Step(Record):
    incarnation: str
    step: int
    tokens: int
    step_time: float | None
    pulls: int
    pull_latency_ms: float | None
    wire_up: int | None = None  # bytes on the wire so far, both channels (live/comm/wire.py)
    wire_down: int | None = None


# -- live learner's communication side --------------------------------------------------------
@_kind("heal_needed")
class HealNeeded(Record):
    reason: str


@_kind("comm_fatal")
class CommFatal(Record):
    reason: str


@_kind("final_beat_lost")
class FinalBeatLost(Record):
    tokens: int


@_kind("refused_by_syncer")
class RefusedBySyncer(Record):
    reason: str


@_kind("push_refused")
class PushRefused(Record):
    fragment: int
    reason: str


@_kind("push_failed")
class PushFailed(Record):
    fragment: int
    error: str


@_kind("transfer_failed")
class TransferFailed(Record):
    error: str


@_kind("disconnected")
class Disconnected(Record):
    retry_in_s: float


@_kind("reconnected")
class Reconnected(Record):
    heal: bool
    epoch: str


# -- live syncer ---------------------------------------------------------------------------
@_kind("syncer_started")
class SyncerStarted(Record):
    port: int
    epoch: str
    restored: bool
    fd_limit: int | None = None  # the soft descriptor limit after raising it to the hard one
    fd_limit_before: int | None = None
    fd_limit_hard: int | None = None


@_kind("syncer_stopped")
class SyncerStopped(Record):
    rounds: int


@_kind("restored")
class Restored(Record):
    snapshot_records: int
    replayed: int
    rounds_closed: int
    versions: list
    lost_committed_rounds: int


@_kind("evaluated")
class Evaluated(Record):
    """The global model's held-out loss, taken by the syncer while the run goes."""

    tokens: int  # the run's tokens when the values were taken
    rounds: int
    eval_loss: float
    eval_s: float  # how long the evaluation took


@_kind("snapshot")
class Snapshot(Record):
    tape_next: int
    rounds: int


@_kind("seen_check")
class SeenCheck(Record):
    learner: str
    lost_committed_rounds: int
    implausible: str | None = None


@_kind("transfer_broken")
class TransferBroken(Record):
    learner: str
    fragment: int
    error: str


@_kind("auth_refused")
class AuthRefused(Record):
    method: str
    reason: str
    count: int | None = None


@_kind("limit_reached")
class LimitReached(Record):
    what: str
    limit: int
    learner: str | None = None


@_kind("restore_failed")
class RestoreFailed(Record):
    error: str
    run_dir: str


@_kind("snapshot_failed")
class SnapshotFailed(Record):
    error: str


@_kind("disk_failed")
class DiskFailed(Record):
    error: str
    path: str


@_kind("thread_died")
class ThreadDied(Record):
    thread: str
    error: str


# -- launcher -----------------------------------------------------------------------------
@_kind("run_started")
class RunStarted(Record):
    run_id: str
    address: str


@_kind("run_ended")
class RunEnded(Record):
    interrupted: bool


@_kind("timeout")
class Timeout(Record):
    max_wall_s: float


@_kind("started")
class Started(Record):
    process: str
    pid: int


@_kind("restarted")
class Restarted(Record):
    process: str
    pid: int


@_kind("crashed")
class Crashed(Record):
    process: str
    rc: int


@_kind("chaos")
class Chaos(Record):
    action: str
    process: str
    duration_s: float


@dataclass(frozen=True)
class Event:
    t: float
    source: str
    data: Record

    @property
    def kind(self) -> str:
        return self.data.KIND

    @staticmethod
    def make(t: float, kind: str, source: str, **fields: Any) -> Event:
        """An event of a named kind; unknown kinds and fields are refused (TypeError/KeyError
        naming them)."""
        cls = KINDS.get(kind)
        if cls is None:
            raise KeyError(f"event kind {kind!r} is not one of atoll.core.events.KINDS")
        return Event(t, source, cls(**fields))

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Event:
        return Event.make(d["t"], d["kind"], d["source"], **d.get("data", {}))

    def to_dict(self) -> dict[str, Any]:
        return {"t": self.t, "kind": self.kind, "source": self.source, "data": self.data.to_dict()}
