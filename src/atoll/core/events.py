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

from atoll.core.records import KINDS as KINDS  # the closed set, filled by the kinds below
from atoll.core.records import Event as Event
from atoll.core.records import Record, kind


# -- protocol -------------------------------------------------------------------------------
@kind("joined")
class Joined(Record):
    learner: str
    incarnation: str | None = None
    heal: bool | None = None


FINISHED = "finished"  # a Lost's `why` when the learner said its last beat first: a finish


@kind("lost")
class Lost(Record):
    """A learner's session ended: lost (`why`: how), or finished (`why` FINISHED: its final
    beat came before its stream ended)."""

    learner: str
    why: str | None = None


@kind("run_over")
class RunOver(Record):
    """The token budget is spent and the run is over (core/budget.py, `RunEnd`): every learner
    left after its final flush ("flushed"), or the window after the budget passed ("window",
    `left`: the learners still with a session)."""

    reason: str
    waited_s: float
    left: list[str] | None = None


@kind("accepted")
class Accepted(Record):
    learner: str
    fragment: int
    seq: int
    bytes: int
    work_s: float


@kind("refused")
class Refused(Record):
    learner: str
    fragment: int
    reason: str
    code: str | None = None


@kind("round_closed")
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


@kind("merge_refused")
class MergeRefused(Record):
    fragment: int
    participants: list
    reason: str


@kind("link_bottleneck")
class LinkBottleneck(Record):
    learner: str
    upload_s: float
    overlap_s: float


@kind("healed")
class Healed(Record):
    versions: list | None = None
    incarnation: str | None = None
    since_start_s: float | None = None


@kind("applied")
class Applied(Record):
    fragment: int
    version: int
    mode: str


# -- drivers: learners -------------------------------------------------------------------------
@kind("sent")
class Sent(Record):
    fragment: int
    seq: int
    base_version: int
    bytes: int
    steps: int
    tokens: int


@kind("blocked")
class Blocked(Record):
    wait_s: float


@kind("failed")
class Failed(Record):
    lost_steps_s: float


@kind("rejoined")
class Rejoined(Record):
    downtime_s: float


@kind("training")
class Training(Record):
    incarnation: str
    since_start_s: float
    island: int = 1  # ranks training as this learner (an island of N processes)


@kind("step")
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
@kind("heal_needed")
class HealNeeded(Record):
    reason: str


@kind("comm_fatal")
class CommFatal(Record):
    reason: str


@kind("final_beat_lost")
class FinalBeatLost(Record):
    tokens: int


@kind("refused_by_syncer")
class RefusedBySyncer(Record):
    reason: str


@kind("push_refused")
class PushRefused(Record):
    fragment: int
    reason: str


@kind("push_failed")
class PushFailed(Record):
    fragment: int
    error: str


@kind("transfer_failed")
class TransferFailed(Record):
    error: str


@kind("disconnected")
class Disconnected(Record):
    retry_in_s: float


@kind("reconnected")
class Reconnected(Record):
    heal: bool
    epoch: str


# -- live syncer ---------------------------------------------------------------------------
@kind("syncer_started")
class SyncerStarted(Record):
    port: int
    epoch: str
    restored: bool
    fd_limit: int | None = None  # the soft descriptor limit after raising it to the hard one
    fd_limit_before: int | None = None
    fd_limit_hard: int | None = None


@kind("syncer_stopped")
class SyncerStopped(Record):
    rounds: int


@kind("restored")
class Restored(Record):
    snapshot_records: int
    replayed: int
    rounds_closed: int
    versions: list
    lost_committed_rounds: int


@kind("evaluated")
class Evaluated(Record):
    """The global model's held-out loss, taken by the syncer while the run goes."""

    tokens: int  # the run's tokens when the values were taken
    rounds: int
    eval_loss: float
    eval_s: float  # how long the evaluation took


@kind("snapshot")
class Snapshot(Record):
    tape_next: int
    rounds: int


@kind("seen_check")
class SeenCheck(Record):
    learner: str
    lost_committed_rounds: int
    implausible: str | None = None


@kind("transfer_broken")
class TransferBroken(Record):
    learner: str
    fragment: int
    error: str


@kind("auth_refused")
class AuthRefused(Record):
    method: str
    reason: str
    count: int | None = None


@kind("limit_reached")
class LimitReached(Record):
    what: str
    limit: int
    learner: str | None = None


@kind("restore_failed")
class RestoreFailed(Record):
    error: str
    run_dir: str


@kind("snapshot_failed")
class SnapshotFailed(Record):
    error: str


@kind("disk_failed")
class DiskFailed(Record):
    error: str
    path: str


@kind("thread_died")
class ThreadDied(Record):
    thread: str
    error: str


# -- launcher -----------------------------------------------------------------------------
@kind("run_started")
class RunStarted(Record):
    run_id: str
    address: str


@kind("run_ended")
class RunEnded(Record):
    interrupted: bool


@kind("timeout")
class Timeout(Record):
    max_wall_s: float


@kind("started")
class Started(Record):
    process: str
    pid: int


@kind("restarted")
class Restarted(Record):
    process: str
    pid: int


@kind("crashed")
class Crashed(Record):
    process: str
    rc: int


@kind("chaos")
class Chaos(Record):
    action: str
    process: str
    duration_s: float
