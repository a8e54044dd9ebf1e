"""The start of a learner's run, for `Learner.__init__`: the syncer's Welcome (one per shard of
a sharded syncer, core/shards.py) and the first heal.

`Welcomes` keeps each shard's epoch and checks that every shard describes the same plan; a
learner trains once every fragment has a value: one heal from an unsharded syncer, one heal per
shard from a sharded one (each carries that shard's fragments)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from atoll.core.fragments import FragmentPlan
from atoll.core.learner import LearnerProtocol
from atoll.live.learner.messages import CommFailed, CommStatus, HealReceived, Welcomed
from atoll.wire import atoll_pb2 as pb
from atoll.wire import convert


class Welcomes:
    """The newest Welcome of each shard (an unsharded syncer: shard 0 of 1)."""

    def __init__(self) -> None:
        self.epochs: dict[int, str] = {}
        self.first: pb.Welcome | None = None
        self.plan: FragmentPlan | None = None

    def take(self, data: bytes) -> tuple[pb.Welcome, bool]:
        """A Welcome, and whether its shard restarted since the last one (a new epoch)."""
        w = pb.Welcome.FromString(data)
        restarted = self.epochs.get(w.shard, w.epoch) != w.epoch
        self.epochs[w.shard] = w.epoch
        return w, restarted

    def first_plan(self, w: pb.Welcome) -> FragmentPlan:
        """The plan of the first Welcome; every other shard's must be the same."""
        plan = convert.plan_from_welcome(w)
        if self.plan is None:
            self.first, self.plan = w, plan
        elif plan != self.plan:
            raise ConnectionError(
                f"shard {w.shard}/{w.shards} describes another model than shard "
                f"{self.first.shard}/{self.first.shards} (their fragment plans differ): the "
                "addresses name shards of different runs"
            )
        return plan


def first_heal(learner: Any, timeout: float) -> None:
    """Wait for the Welcome(s) and the heal(s) until every fragment has a value; the model
    must be the syncer's (checked at the first Welcome, before any heal is applied)."""
    deadline = time.time() + timeout
    welcomes = learner._welcomes
    while time.time() < deadline:
        match learner.port.get(0.2):
            case Welcomed(data):
                w, _ = welcomes.take(data)
                first = welcomes.plan is None
                plan = welcomes.first_plan(w)
                if first:
                    plan.check_params(learner.params)  # before the heal: the syncer's model?
            case CommFailed(reason):
                raise ConnectionError(reason)
            case CommStatus() as st:
                learner._status(st)
            case HealReceived(heal) if welcomes.plan is not None:
                if learner.proto is None:
                    make_protocol(learner, welcomes.first, welcomes.plan)
                learner._apply_heal(heal)
                if learner.proto.healed:
                    return
    raise TimeoutError(f"no heal from the syncer at {learner.address} within {timeout:.0f} s")


def make_protocol(learner: Any, welcome: pb.Welcome, plan: FragmentPlan) -> None:
    """The learner protocol, with the settings the syncer's Welcome gives."""
    cfg = convert.learner_config_from_welcome(welcome, block=True)
    cfg = dataclasses.replace(cfg, max_wait_s=learner.wait_s)
    flat = learner._fragments(plan)
    proto = LearnerProtocol(learner.id, plan, learner.params, cfg, flat, learner.budget)
    proto.delta_out = learner.port.delta_buffer  # e.g. into a shared slot
    learner.port.layout([f.numel for f in plan.fragments])
    learner.proto = proto
