"""What the training side and its communication side (atoll.live.comm) say to each other.

A closed set of frozen dataclasses, one per kind, the same in thread mode (passed as objects)
and process mode (pickled through `atoll.live.comm.framing`). Each side dispatches on the
type (`match`).

Down (training -> communication): `Start` (first, process mode only), `StepState` (after every
step boundary), `Reset`, `RequestHeal`, `Finishing`, `BeatOnce`, `Close`.
Up (communication -> training): `Welcomed`, `HealReceived`, `UpdateReceived`, `PullReceived`,
`CommStatus`, `RefusalReceived`, `CommFailed`, `JoinRetry`, `BeatDone`.

Vectors stay out of the pickles where they can: in process mode a contribution's delta (up)
and a decoded update (down) go through the shared slots (atoll.live.shm) and the message names
the slot (an int), or they travel as numpy arrays (which pickle plainly; a torch tensor costs
~0.25 ms).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import torch

from atoll.core.messages import FragmentUpdate, Heal, Outgoing, Pull, Resume

# a vector in a message: the tensor itself (thread mode), a numpy array or the number of the
# shared slot it is in (process mode), or None (none: the receiver decodes the payload itself)
Vector: TypeAlias = "torch.Tensor | np.ndarray | int | None"


@dataclass(frozen=True)
class CommOptions:
    address: str
    learner_id: str
    incarnation: str
    run_id: str
    secret: str
    tls_ca: str | None = None
    shape_mbps: float = 0.0
    heartbeat_s: float = 0.5
    status_interval_s: float = 0.25  # queue and byte counters to the training side, at most
    events_path: str | None = None
    nice: int = 10  # child process only: added niceness (measured: fewer preemptions)
    parent_pid: int = 0  # child process only: the training process (no beats while stopped)
    faults_path: str | None = None  # chaos: link faults written by the launcher (comm/faults)
    # the parameters' digests by name at start (codec.digest): a fresh learner's first heal
    # leaves out the fragments it already holds
    digests: tuple[tuple[str, bytes], ...] = ()
    # a sharded syncer (core/shards.py): `address` lists every shard's, in shard order; each
    # shard's connection is told which shard it takes its syncer for
    shard: int = 0
    shards: int = 0
    ranks: int = 1  # the island's size, said in the Hello (the syncer's page shows it)


# -- down: training -> communication ---------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    """A contribution handed over, still to be encoded. `outgoing.delta` is the vector unless
    `vector` carries it (process mode: a slot number or a numpy array). Pickling never
    includes the delta tensor itself: it travels as `vector` (a numpy array when not set)."""

    outgoing: Outgoing
    vector: np.ndarray | int | None = None

    def __reduce__(self) -> tuple:
        o = self.outgoing
        meta = tuple(getattr(o, name) for name in _META)
        vector = self.vector if self.vector is not None else o.delta.cpu().numpy()
        return (_rebuild_submit, (meta, vector))

    def with_delta(self, delta: torch.Tensor) -> Submit:
        """This contribution with its vector in place (what the encoder gets)."""
        return Submit(dataclasses.replace(self.outgoing, delta=delta))


_NO_DELTA = torch.empty(0)
# Outgoing's fields but the delta (its last), in order: a pickled Submit is a plain tuple
_META = tuple(f.name for f in dataclasses.fields(Outgoing))[:-1]
assert dataclasses.fields(Outgoing)[-1].name == "delta"


def _rebuild_submit(meta: tuple, vector: np.ndarray | int) -> Submit:
    """The receiving side of a pickled `Submit`: the vector as `vector`, no delta yet."""
    return Submit(Outgoing(*meta, delta=_NO_DELTA), vector)


@dataclass(frozen=True)
class Start:
    """The first message to a child process: its options."""

    options: CommOptions


@dataclass(frozen=True)
class StepState:
    """After a step boundary: counters for heartbeats (which also pace the syncer's pull
    clock), what a rejoin's Hello says (the learner protocol's `rejoin_says`), and the
    contributions now due."""

    steps: int
    tokens: int
    work_s: float
    step_time: float
    rejoin: Resume | None
    submits: tuple[Submit, ...] = ()
    ask: bool = False  # its share of the budget's rest is trained: a heartbeat at once


@dataclass(frozen=True)
class Reset:
    """The learner healed: contributions of an older generation are obsolete (of the healed
    `fragments`; empty: all)."""

    generation: int
    fragments: tuple[int, ...] = ()


@dataclass(frozen=True)
class RequestHeal:
    """Rejoin with a heal (an update that does not chain, a refusal asking for one): the
    syncer (the shard) that serves `fragment` (-1: every one)."""

    fragment: int = -1


@dataclass(frozen=True)
class Finishing:
    """The training side waits for the send queue to drain: report it after every send."""


FINAL_BEAT_S = 5.0  # how long a finishing learner tries to have its final counters counted


@dataclass(frozen=True)
class BeatOnce:
    """Send one heartbeat now (final counters), then answer `BeatDone`."""


@dataclass(frozen=True)
class Close:
    """Stop (process mode: the child exits)."""


ToComm: TypeAlias = "Start | StepState | Reset | RequestHeal | Finishing | BeatOnce | Close"


# -- up: communication -> training -----------------------------------------------------------
@dataclass(frozen=True)
class Welcomed:
    """The syncer's Welcome (a serialized `pb.Welcome`: plan and settings)."""

    welcome: bytes


@dataclass(frozen=True)
class HealReceived:
    heal: Heal


@dataclass(frozen=True)
class UpdateReceived:
    """A broadcast update and its payload decoded (a float32 vector, see `Vector`)."""

    update: FragmentUpdate
    value: Vector = None


@dataclass(frozen=True)
class PullReceived:
    """A pull, and when the communication side received it (wall-clock seconds)."""

    pull: Pull
    received_at: float


@dataclass(frozen=True)
class CommStatus:
    """The communication side's counters. Numbered (`seq`): snapshots from different threads
    may overtake each other. `stop`: the syncer says the run is over; `budget`: the syncer's
    answer about the token budget, as it gave it: (this learner's tokens at that heartbeat,
    tokens remaining, learners live); the training side decides what share is its own."""

    seq: int = 0
    connected: bool = False
    bytes_up: int = 0
    reconnects: int = 0
    queued: int = 0
    received: int = 0  # submits handed over so far (the training side compares its count)
    stop: bool = False
    budget: tuple[int, int, int] | None = None
    wire: tuple[int, int] | None = None  # bytes out, in on the wire (comm.wire), if measured


@dataclass(frozen=True)
class RefusalReceived:
    """The syncer refused a contribution (its answer; `action` "heal" asks for a heal). (The
    event the training side then writes is atoll.core.events.PushRefused.)"""

    fragment: int
    reason: str
    action: str


@dataclass(frozen=True)
class NotSent:
    """A contribution that did not encode: the learner protocol decides what follows
    (`LearnerProtocol.on_unsendable`: a heal)."""

    fragment: int
    reason: str


@dataclass(frozen=True)
class CommFailed:
    """The communication side cannot go on (refused by the syncer, the child ended). `kind`
    says which (the training side raises the matching `atoll.errors.LearnerError`): "auth"
    (the syncer refused the secret, run id or protocol), "refused" (it refused this learner
    otherwise), "unusable" (its Welcome cannot be used), "" (the side itself is gone)."""

    reason: str
    kind: str = ""


@dataclass(frozen=True)
class JoinRetry:
    """A Join that found no syncer before the first Welcome (`reason`: what it met, e.g.
    "connection refused"); the stream is tried again. `attempts`: Joins so far, this one
    included."""

    address: str
    attempts: int
    reason: str


@dataclass(frozen=True)
class BeatDone:
    """The heartbeat `BeatOnce` asked for was counted by the syncer, or could not be."""

    counted: bool = True


FromComm: TypeAlias = (
    "Welcomed | HealReceived | UpdateReceived | PullReceived | CommStatus | RefusalReceived"
    " | NotSent | CommFailed | JoinRetry | BeatDone"
)
