"""One learner of the virtual-time driver: its model, data, clock and links, and the learner
protocol (atoll.core.learner) that decides what it does. Its lifecycle is the protocol's
`phase`; `member` is the world's: whether the scenario has added it yet or removed it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from atoll.core.codec import ContributionEncoder
from atoll.core.events import Event, Step
from atoll.core.learner import LearnerProtocol, Phase
from atoll.core.messages import CONTROL_BYTES, FragmentUpdate, Heal, PushAnswer, Resumed
from atoll.model.adamw import AdamW
from atoll.model.train import DataStream
from atoll.sim.world import FailureSchedule, Link, StepClock, Windows


@dataclass
class SimLearner:
    id: str
    index: int
    model: torch.nn.Module
    opt: AdamW
    proto: LearnerProtocol
    data: DataStream
    clock: StepClock
    failures: FailureSchedule
    up: Link
    down: Link
    member: str = "in"  # in | absent (the scenario adds it later) | gone (removed for good)
    incarnation: int = 0
    local_steps: int = 0
    down_since: float = 0.0
    encoder: ContributionEncoder | None = None
    inflight: dict[int, float] = field(default_factory=dict)  # seq -> step-seconds
    step_at: float = 0.0  # when the step in progress ends (its own time: step_dt)
    step_dt: float = 0.0
    stalls: Windows | None = None  # chaos: when its process is stopped
    net: Windows | None = None  # chaos: when its link is cut or slowed (= up/down.outages)
    # this incarnation's counters, as a live learner process reports them (`step` events)
    steps: int = 0
    tokens: int = 0
    wire0: tuple[int, int] = (0, 0)  # its links' bytes when it started

    def stepped(self, tokens: int) -> None:
        self.steps, self.tokens = self.steps + 1, self.tokens + tokens

    def report(self, now: float) -> Event:
        """Its `step` event: this incarnation's steps, tokens and bytes each way so far (the
        virtual-time driver reports one with each contribution and at the end)."""
        up, down = self.up.bytes_sent - self.wire0[0], self.down.bytes_sent - self.wire0[1]
        st = Step(str(self.incarnation), self.steps, self.tokens, self.step_dt, 0, None, up, down)
        return Event(now, self.id, st)

    def restart(self) -> None:
        """Its process died: the next incarnation counts from zero."""
        self.incarnation += 1
        self.steps = self.tokens = 0
        self.wire0 = (self.up.bytes_sent, self.down.bytes_sent)

    @property
    def phase(self) -> Phase:
        return self.proto.phase

    @property
    def finished(self) -> bool:
        """The run no longer waits for it: done, not added yet, or removed."""
        return self.member != "in" or self.proto.phase is Phase.DONE


@dataclass(frozen=True)
class Answered:
    """The syncer's reply to a learner's contribution of `fragment` (only refusals are
    delivered: an accepted push needs nothing of the learner)."""

    fragment: int
    answer: PushAnswer


def nbytes_of(msg: object) -> int:
    """What a syncer message costs on a simulated link."""
    if isinstance(msg, Heal):
        return msg.nbytes
    if isinstance(msg, FragmentUpdate):
        return len(msg.payload)
    if isinstance(msg, Resumed):
        return sum(len(u.payload) for u in msg.updates)
    return CONTROL_BYTES
