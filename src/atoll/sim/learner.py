"""One learner of the virtual-time driver: its model, data, clock and links, and the learner
protocol (atoll.core.learner) that decides what it does. Its lifecycle is the protocol's
`phase`; `member` is the world's: whether the scenario has added it yet or removed it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from atoll.core.codec import ContributionEncoder
from atoll.core.learner import LearnerProtocol, Phase
from atoll.core.messages import CONTROL_BYTES, FragmentUpdate, Heal, PushAnswer, Resumed
from atoll.model.train import DataStream
from atoll.sim.world import FailureSchedule, Link, StepClock, Windows


@dataclass
class SimLearner:
    id: str
    index: int
    model: torch.nn.Module
    opt: torch.optim.Optimizer
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
