"""Protobuf messages (atoll.proto) <-> the core's messages, both directions, in one place.

The live syncer and the learner's communication side both use these; neither builds or reads
a protobuf message field by field anywhere else.
"""

from __future__ import annotations

import dataclasses
import math

from atoll.core.fragments import Fragment, FragmentPlan
from atoll.core.learner import LearnerConfig
from atoll.core.messages import Contribution, FragmentUpdate, Progress, Pull, Resume
from atoll.wire import PROTOCOL
from atoll.wire import atoll_pb2 as pb
from atoll.wire.chunks import crc32

SENT_AT_WINDOW_S = 600.0  # a contribution's send time is taken within this much of arrival


# -- updates (syncer -> learner) ---------------------------------------------------------------
def update_header(u: FragmentUpdate, heal: bool = False, inline: bool = True) -> pb.UpdateHeader:
    """The header of an update; `inline`: it carries the whole payload (no chunks follow)."""
    return pb.UpdateHeader(
        fragment=u.fragment,
        version=u.version,
        kind=u.kind,
        base_version=u.base_version,
        included=[pb.Included(learner=lid, seq=s) for lid, s in u.included],
        closed_at=u.closed_at,
        total_bytes=len(u.payload),
        crc32=crc32(u.payload),
        heal=heal,
        payload=u.payload if inline else b"",
    )


def update_from_header(h: pb.UpdateHeader, payload: bytes) -> FragmentUpdate:
    return FragmentUpdate(
        h.fragment,
        h.version,
        h.kind,
        h.base_version,
        payload,
        tuple((i.learner, i.seq) for i in h.included),
        h.closed_at,
    )


# -- contributions (learner -> syncer) ---------------------------------------------------------
def contribution_header(c: Contribution, incarnation: str) -> pb.ContributionHeader:
    return pb.ContributionHeader(
        protocol=PROTOCOL,
        learner=c.learner,
        incarnation=incarnation,
        fragment=c.fragment,
        seq=c.seq,
        base_version=c.base_version,
        steps=c.steps,
        tokens=c.tokens,
        sent_at=c.sent_at,
        step_time=c.step_time,
        total_bytes=len(c.payload),
        crc32=crc32(c.payload),
        work_s=c.work_s,
    )


def contribution_from_header(h: pb.ContributionHeader, payload: bytes, now: float) -> Contribution:
    """The core's Contribution; the learner's clock is trusted only within SENT_AT_WINDOW_S
    of the arrival (a finite sent_at >= 0 is clamped there; others go on for the core to
    refuse)."""
    sent_at = h.sent_at
    if math.isfinite(sent_at) and sent_at >= 0:
        sent_at = min(max(sent_at, now - SENT_AT_WINDOW_S), now)
    return Contribution(
        learner=h.learner,
        fragment=h.fragment,
        seq=h.seq,
        base_version=h.base_version,
        payload=payload,
        steps=h.steps,
        tokens=h.tokens,
        sent_at=sent_at,
        step_time=h.step_time,
        work_s=h.work_s,
    )


# -- joining ------------------------------------------------------------------------------------
def welcome(
    plan: FragmentPlan,
    cfg: LearnerConfig,
    epoch: str,
    heal: bool,
    chunk_bytes: int,
    max_fragment_bytes: int,
) -> pb.Welcome:
    frags = [
        pb.FragmentSpec(
            index=f.index,
            tensors=[
                pb.TensorSpec(name=n, shape=list(s)) for n, s in zip(f.names, f.shapes, strict=True)
            ],
            offset=f.offset,
            is_embedding=f.is_embedding,
        )
        for f in plan.fragments
    ]
    settings = pb.LearnerSettings(
        tau=cfg.tau,
        codec=cfg.codec,
        group=cfg.group,
        error_feedback=cfg.error_feedback,
        receipt=cfg.receipt,
        alpha=cfg.alpha,
        schedule=cfg.schedule,
    )
    return pb.Welcome(
        protocol=PROTOCOL,
        epoch=epoch,
        H=plan.H,
        fragments=frags,
        settings=settings,
        heal=heal,
        chunk_bytes=chunk_bytes,
        max_fragment_bytes=max_fragment_bytes,
    )


def plan_from_welcome(w: pb.Welcome) -> FragmentPlan:
    frags = tuple(
        Fragment(
            index=f.index,
            names=tuple(t.name for t in f.tensors),
            shapes=tuple(tuple(int(d) for d in t.shape) for t in f.tensors),
            offset=f.offset,
            is_embedding=f.is_embedding,
        )
        for f in w.fragments
    )
    return FragmentPlan(fragments=frags, H=w.H)


def learner_config_from_welcome(w: pb.Welcome, block: bool = True) -> LearnerConfig:
    s = w.settings
    fields = {
        f.name: getattr(s, f.name) for f in dataclasses.fields(LearnerConfig) if hasattr(s, f.name)
    }
    return LearnerConfig(**{**fields, "block": block, "schedule": s.schedule or "push"})


def hello(learner: str, incarnation: str, resume: Resume | None, epoch: str = "") -> pb.Hello:
    """A Join's Hello: a fresh learner (`resume` None), or one with a past (`epoch`: the
    syncer epoch its versions came from)."""
    if resume is None:
        return pb.Hello(protocol=PROTOCOL, learner=learner, incarnation=incarnation)
    return pb.Hello(
        protocol=PROTOCOL,
        learner=learner,
        incarnation=incarnation,
        resume=resume.keep_progress,
        base_versions=list(resume.base_versions),
        latest_versions=list(resume.latest_versions),
        epoch=epoch,
    )


def resume_from_hello(h: pb.Hello, epoch: str) -> Resume | None:
    """What a Hello says of the learner's past (None: a fresh learner)."""
    if not (h.resume or h.epoch):
        return None
    return Resume(
        tuple(h.base_versions),
        tuple(h.latest_versions),
        other_epoch=bool(h.epoch) and h.epoch != epoch,
        keep_progress=h.resume,
    )


# -- control ------------------------------------------------------------------------------------
def pulls_message(pulls: list[Pull]) -> pb.ControlDown:
    return pb.ControlDown(
        pulls=[pb.PullRequest(fragment=x.fragment, tick=x.tick, at=x.at) for x in pulls]
    )


def pulls_from_message(msg: pb.ControlDown) -> list[Pull]:
    return [Pull(x.fragment, x.tick, x.at) for x in msg.pulls]


def control_hello(learner: str, incarnation: str) -> pb.ControlHello:
    return pb.ControlHello(protocol=PROTOCOL, learner=learner, incarnation=incarnation)


def beat(learner: str, incarnation: str, tokens: int, p: Progress) -> pb.Beat:
    """A heartbeat: liveness, this incarnation's tokens, and its step report `p`."""
    return pb.Beat(
        learner=learner,
        incarnation=incarnation,
        step=p.step,
        tokens=tokens,
        step_time=p.step_time,
        work_s=p.work_s,
    )


def progress_from_beat(b: pb.Beat, now: float) -> Progress:
    return Progress(b.learner, b.step, b.step_time, now, b.work_s)
