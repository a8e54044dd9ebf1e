"""The start of a learner's run, for `Learner.__init__`: the syncer's Welcome (one per shard of
a sharded syncer, core/shards.py) and the first heal.

`Welcomes` keeps each shard's epoch and checks that every shard describes the same plan; a
learner trains once every fragment has a value: one heal from an unsharded syncer, one heal per
shard from a sharded one (each carries that shard's fragments).

What stops the start is one line (atoll.errors): a refused secret at once (`AuthError`), a
syncer that cannot be joined (`JoinError`), and after the join timeout `JoinTimeoutError`,
saying what the last attempt met where no syncer answered (connection refused at HOST:PORT);
meanwhile such attempts are said (logger "atoll.learner", every `RETRY_SAY_S` at most)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from atoll.core.fragments import FragmentPlan
from atoll.core.learner import LearnerProtocol
from atoll.errors import CommError, JoinError, JoinTimeoutError, LearnerError
from atoll.live.client import check_secret, refused
from atoll.live.comm.messages import CommFailed, CommStatus, HealReceived, JoinRetry, Welcomed
from atoll.wire import atoll_pb2 as pb
from atoll.wire import convert

log = logging.getLogger("atoll.learner")
RETRY_SAY_S = 5.0  # a syncer that does not answer is said at the first attempt, then this often


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
            raise JoinError(
                f"shard {w.shard}/{w.shards} describes another model than shard "
                f"{self.first.shard}/{self.first.shards} (their fragment plans differ): the "
                "addresses name shards of different runs"
            )
        return plan


def failure(learner: Any, failed: CommFailed) -> LearnerError:
    """The one-line exception for a communication side that cannot go on (its `kind`)."""
    who = f"learner {learner.id}"
    reason = failed.reason.removeprefix("syncer refused us: ")
    if failed.kind == "auth":
        return refused(who, learner.address, reason, learner._comm.run_id)
    if failed.kind == "refused":
        return JoinError(f"{who}: the syncer at {learner.address} refused it: {reason}")
    if failed.kind == "unusable":
        return JoinError(f"{who}: {failed.reason}")
    return CommError(f"{who}: {failed.reason}")


def first_heal(learner: Any, timeout: float) -> None:
    """Wait for the Welcome(s) and the heal(s) until every fragment has a value; the model
    must be the syncer's (checked at the first Welcome, before any heal is applied)."""
    deadline = time.time() + timeout
    # the secret checked with one call while the communication side starts (a child process
    # takes seconds to import torch): a wrong one is said at once
    c = learner._comm
    check_secret(f"learner {learner.id}", learner.address, c.run_id, c.secret, c.tls_ca,
                 min(2.0, timeout))  # fmt: skip
    welcomes = learner._welcomes
    retry: JoinRetry | None = None  # the newest attempt that found no syncer, since a Welcome
    said: float | None = None  # when an attempt was last said (monotonic)
    heard = False  # anything from the communication side
    while time.time() < deadline:
        item = learner.port.get(0.2)
        heard = heard or item is not None
        match item:
            case Welcomed(data):
                retry = None
                w, _ = welcomes.take(data)
                first = welcomes.plan is None
                plan = welcomes.first_plan(w)
                if first:
                    plan.check_params(learner.params)  # before the heal: the syncer's model?
            case CommFailed() as failed:
                raise failure(learner, failed)
            case JoinRetry() as retry:
                if said is None or time.monotonic() - said >= RETRY_SAY_S:
                    said = time.monotonic()
                    log.warning(
                        "learner %s: %s at %s, retrying (%d)",
                        learner.id, retry.reason, retry.address, retry.attempts,
                    )  # fmt: skip
            case CommStatus() as st:
                learner._status(st)
            case HealReceived(heal) if welcomes.plan is not None:
                if learner.proto is None:
                    make_protocol(learner, welcomes.first, welcomes.plan)
                learner._apply_heal(heal)
                if learner.proto.healed:
                    return
    if retry is not None:
        raise JoinTimeoutError(
            f"learner {learner.id}: {retry.reason} at {retry.address}: no syncer answered "
            f"within the join timeout of {timeout:g} s ({retry.attempts} attempts); start the "
            "syncer first, or give its address (host:port)"
        )
    what = "no heal from" if welcomes.plan is not None else "no answer from"
    msg = f"learner {learner.id}: {what} the syncer at {learner.address} within the join "
    msg += f"timeout of {timeout:g} s"
    if not heard:  # not even from the communication side: a child process still starting
        msg += " (nor from its communication side, slow to start on a busy host: a longer one?)"
    raise JoinTimeoutError(msg)


def make_protocol(learner: Any, welcome: pb.Welcome, plan: FragmentPlan) -> None:
    """The learner protocol, with the settings the syncer's Welcome gives."""
    cfg = convert.learner_config_from_welcome(welcome, block=True)
    cfg = dataclasses.replace(cfg, max_wait_s=learner.options.wait_s)
    flat = learner._fragments(plan)
    proto = LearnerProtocol(learner.id, plan, learner.params, cfg, flat, learner.budget)
    proto.delta_out = learner.port.delta_buffer  # e.g. into a shared slot
    learner.port.layout([f.numel for f in plan.fragments])
    learner.proto = proto
