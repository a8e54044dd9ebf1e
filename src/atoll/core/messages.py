"""The protocol's messages, independent of how they travel (virtual links or gRPC)."""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class FragmentUpdate:
    """Syncer -> learner: a new global value of one fragment.

    kind "full": payload is the value. kind "delta": payload is (new - previous public value),
    to be added to the value of `base_version`. `included` lists (learner, seq) merged.
    """

    fragment: int
    version: int
    kind: str
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
    step: int
    step_time: float
    at: float


@dataclass(frozen=True)
class Heal:
    """Syncer -> (re)joining learner: every fragment's current global value, in full."""

    updates: tuple[FragmentUpdate, ...]

    @property
    def nbytes(self) -> int:
        return sum(len(u.payload) for u in self.updates)


@dataclass(frozen=True)
class Send:
    """Output of a protocol: deliver `message` to `to` ("syncer" or a learner id)."""

    to: str
    message: object


@dataclass(frozen=True)
class SetTimer:
    """Output of a protocol: call its `on_timer(key)` at time `at`."""

    at: float
    key: tuple
