"""The protocol's messages, independent of how they travel (virtual links or gRPC)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from atoll.compat import StrEnum
from atoll.core.events import Event, Refused


@dataclass(frozen=True)
class Contribution:
    """Learner -> syncer: the learner's outer gradient for one fragment.

    payload encodes delta = Theta_base - theta_learner (flat float32, codec frame), where
    Theta_base is the global value of version `base_version` that the learner last applied.
    steps/tokens are the learner's counters for this fragment since it last received it.
    """

    learner: str
    fragment: int
    seq: int
    base_version: int
    payload: bytes
    steps: int
    tokens: int
    sent_at: float
    step_time: float
    work_s: float = 0.0  # step-seconds of work this send carries (goodput's useful time)
    # its frame checked and unpacked ahead of the protocol's lock (SyncerProtocol.prepare):
    # never sent, never compared
    unpacked: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Outgoing:
    """Learner protocol -> its driver: a contribution still to be encoded.

    `delta` is base - theta (flat float32, a fresh tensor the receiver owns, or the buffer
    the driver asked for: `LearnerProtocol.delta_out`), taken at the step boundary. The
    driver owns the encoder and its error feedback (`codec.ContributionEncoder`) and encodes
    in send order; `generation` counts the learner's heals, so that residuals start over
    after one and older sends are dropped."""

    learner: str
    fragment: int
    seq: int
    base_version: int
    steps: int
    tokens: int
    sent_at: float
    step_time: float
    work_s: float
    generation: int
    delta: torch.Tensor

    def encoded(self, payload: bytes) -> Contribution:
        return Contribution(
            self.learner,
            self.fragment,
            self.seq,
            self.base_version,
            payload,
            self.steps,
            self.tokens,
            self.sent_at,
            self.step_time,
            self.work_s,
        )


class Action(StrEnum):
    """What a refused learner should do: nothing (send again), rejoin, or heal."""

    NONE = ""
    REJOIN = "rejoin"
    HEAL = "heal"


class Refusal(Enum):
    """Why the syncer refused a contribution; `action` is what the learner should do."""

    NOT_JOINED = "not_joined"  # no live session: rejoin
    FRAGMENT = "fragment"  # fragment index out of range
    STALE_BASE = "stale_base"  # base version no longer held: heal
    COUNTERS = "counters"  # negative steps or tokens
    HEADER = "header"  # a number that is not finite and >= 0, or another protocol
    PAYLOAD = "payload"  # frame does not decode, wrong codec or size
    TOO_LARGE = "too_large"
    TRANSFER = "transfer"  # chunks, size or checksum of the transfer
    MAGNITUDE = "magnitude"  # a delta far beyond what the run has seen (core/guard.py)

    @property
    def action(self) -> Action:
        if self is Refusal.NOT_JOINED:
            return Action.REJOIN
        return Action.HEAL if self in (Refusal.STALE_BASE, Refusal.MAGNITUDE) else Action.NONE


@dataclass(frozen=True)
class PushAnswer:
    """Syncer -> learner: the answer to one contribution (an output of `on_contribution`,
    and of a driver's own refusals): accepted, or refused with the reason, the code
    (`Refusal.value`) and what the learner should do."""

    accepted: bool
    reason: str = ""
    action: Action = Action.NONE
    code: str = ""


@dataclass(frozen=True)
class Rejection:
    """A refusal: its code and the message naming the value and what is allowed."""

    code: Refusal
    reason: str

    def answer(self) -> PushAnswer:
        """The reply the learner gets."""
        return PushAnswer(False, self.reason, self.code.action, self.code.value)

    def refused(self, learner: str, fragment: int) -> Refused:
        """The event that records it."""
        return Refused(learner, fragment, self.reason, self.code.value)


class UpdateKind(StrEnum):
    """What a FragmentUpdate's payload is: the value ("full"), the change of the public value
    ("delta"), or nothing, the learner holds the value already ("held")."""

    FULL = "full"
    DELTA = "delta"
    HELD = "held"


@dataclass(frozen=True)
class FragmentUpdate:
    """Syncer -> learner: a new global value of one fragment.

    kind "full": payload is the value. kind "delta": payload is (new - previous public value),
    to be added to the value of `base_version`. `included` lists (learner, seq) merged.
    """

    fragment: int
    version: int
    kind: UpdateKind
    base_version: int
    payload: bytes
    included: tuple[tuple[str, int], ...]
    closed_at: float


CONTROL_BYTES = 32  # what a small control message (Pull, Progress) costs on the wire


@dataclass(frozen=True)
class Pull:
    """Syncer -> learner (pull schedule): send `fragment` at your next step boundary."""

    fragment: int
    tick: int
    at: float


@dataclass(frozen=True)
class Progress:
    """Learner -> syncer, after every step (pull schedule): tiny metadata, kept off the bulk
    path, from which the syncer measures the step time that paces its pulls."""

    learner: str
    step: int  # steps since the learner (re)joined
    step_time: float  # its measure of the steps since its previous report
    at: float
    work_s: float = 0.0  # its step-seconds since it (re)joined


@dataclass(frozen=True)
class Resume:
    """Learner -> syncer when reconnecting: the versions it is based on and the newest it has
    seen; `keep_progress`: it asks to keep its local progress (else it heals); `other_epoch`:
    it saw an earlier incarnation of the syncer (which then checks that nothing it saw is
    missing)."""

    base_versions: tuple[int, ...]
    latest_versions: tuple[int, ...]
    other_epoch: bool = False
    keep_progress: bool = True

    def healing(self) -> Resume:
        """The same, asking for a heal instead of keeping its progress."""
        return Resume(self.base_versions, self.latest_versions, self.other_epoch, False)


@dataclass(frozen=True)
class Heal:
    """Syncer -> (re)joining learner: every fragment's current global value, in full."""

    updates: tuple[FragmentUpdate, ...]

    @property
    def nbytes(self) -> int:
        return sum(len(u.payload) for u in self.updates)


@dataclass(frozen=True)
class Resumed:
    """Syncer -> reconnecting learner that keeps its progress: the fragments that moved on
    since what it has seen, in full (nothing else is sent)."""

    updates: tuple[FragmentUpdate, ...]


Message = Heal | Resumed | FragmentUpdate | Pull | Progress | Outgoing | Contribution


@dataclass(frozen=True)
class Send:
    """Output of a protocol: deliver `message` to `to` ("syncer" or a learner id)."""

    to: str
    message: Message


@dataclass(frozen=True)
class Commit:
    """Output of the syncer protocol: a merge made `version` of `fragment` (it comes before
    the round's updates: a durable driver records the fragment's state first)."""

    fragment: int
    version: int


@dataclass(frozen=True)
class PullTick:
    """Timer key: the pull clock's tick `tick` is due (the pull schedule)."""

    tick: int


@dataclass(frozen=True)
class CloseRound:
    """Timer key: the round `round_id` of `fragment` is due to close (answer or grace window)."""

    fragment: int
    round_id: int


@dataclass(frozen=True)
class RunDeadline:
    """Timer key: the window after the token budget has passed (core/budget.py, `RunEnd`)."""


TimerKey = PullTick | CloseRound | RunDeadline


@dataclass(frozen=True)
class SetTimer:
    """Output of a protocol: call its `on_timer(key)` at time `at`."""

    at: float
    key: TimerKey


# what the protocols' inputs return (core/syncer.py, core/learner.py): a driver acts on each
SyncerOutput = Send | SetTimer | Commit | PushAnswer | Event
LearnerOutput = Send | Event
