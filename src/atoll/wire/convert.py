"""Protobuf messages (atoll.proto) <-> the core's messages, both directions, in one place.

The live syncer and the learner's communication side both use these; neither builds or reads
a protobuf message field by field anywhere else.

What a message may hold: the syncer's readers (`contribution_from_header`, `resume_from_hello`,
`progress_from_beat`) never raise, whatever the fields: every value goes on to the core, which
refuses or ignores what it cannot use (atoll.core.checks). The learner's readers of what the
syncer sends (`plan_from_welcome`, `learner_config_from_welcome`, `update_from_header`) raise
`MessageError` naming the field, its value and what is allowed; it is a `TransferError`, so the
learner's Join stream handles it as a broken transfer (it reconnects).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping

from atoll.core.admission import resume_of
from atoll.core.budget import BeatAnswer
from atoll.core.codec import MAX_NUMEL
from atoll.core.fragments import Fragment, FragmentPlan
from atoll.core.learner import LearnerConfig
from atoll.core.messages import (
    Contribution,
    FragmentUpdate,
    Progress,
    Pull,
    PushAnswer,
    Resume,
    UpdateKind,
)
from atoll.errors import ConfigError
from atoll.wire import PROTOCOL
from atoll.wire import atoll_pb2 as pb
from atoll.wire.chunks import TransferError, crc32

SENT_AT_WINDOW_S = 600.0  # a contribution's send time is taken within this much of arrival
UPDATE_KINDS = tuple(k.value for k in UpdateKind)


class MessageError(TransferError):
    """A message whose field cannot be used: names the field, the value and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}={value!r} is not allowed: {allowed}")


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
    if h.kind not in UPDATE_KINDS:
        raise MessageError("UpdateHeader.kind", h.kind, f"one of {UPDATE_KINDS}")
    return FragmentUpdate(
        h.fragment,
        h.version,
        UpdateKind(h.kind),
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
    """The syncer's fragment plan: fragments 0..P-1 in order, offsets in [0, H), tensors with
    unique names and dimensions >= 0, at most MAX_NUMEL values per fragment."""
    if w.H < 1:
        raise MessageError("Welcome.H", w.H, "an integer >= 1")
    if not w.fragments:
        raise MessageError("Welcome.fragments", [], "at least one fragment")
    names: set[str] = set()
    frags = []
    for i, f in enumerate(w.fragments):
        where = f"Welcome.fragments[{i}]"
        if f.index != i:
            raise MessageError(f"{where}.index", f.index, f"{i} (fragments in order)")
        if f.offset >= w.H:
            raise MessageError(f"{where}.offset", f.offset, f"an integer in [0, H={w.H})")
        if not f.tensors:
            raise MessageError(f"{where}.tensors", [], "at least one tensor")
        numel = 0
        for j, t in enumerate(f.tensors):
            if not t.name or t.name in names:
                raise MessageError(f"{where}.tensors[{j}].name", t.name, "a unique, non-empty name")
            names.add(t.name)
            n = 1
            for d in t.shape:
                if d < 0:
                    raise MessageError(f"{where}.tensors[{j}].shape", list(t.shape), "dims >= 0")
                n = min(n * d, MAX_NUMEL + 1)
            numel += n
        if numel > MAX_NUMEL:
            raise MessageError(f"{where}", f"{numel} values or more", f"at most {MAX_NUMEL}")
        frags.append(
            Fragment(
                index=f.index,
                names=tuple(t.name for t in f.tensors),
                shapes=tuple(tuple(int(d) for d in t.shape) for t in f.tensors),
                offset=f.offset,
                is_embedding=f.is_embedding,
            )
        )
    return FragmentPlan(fragments=tuple(frags), H=w.H)


def learner_config_from_welcome(w: pb.Welcome, block: bool = True) -> LearnerConfig:
    """The learner's settings, checked (`LearnerConfig.validate`) against the Welcome's H."""
    s = w.settings
    fields = {
        f.name: getattr(s, f.name) for f in dataclasses.fields(LearnerConfig) if hasattr(s, f.name)
    }
    cfg = LearnerConfig(**{**fields, "block": block, "schedule": s.schedule or "push"})
    if w.H < 1:
        raise MessageError("Welcome.H", w.H, "an integer >= 1")
    try:
        cfg.validate(w.H)
    except ConfigError as exc:
        raise MessageError(f"Welcome.settings.{exc.setting}", exc.value, exc.allowed) from None
    return cfg


def hello(
    learner: str,
    incarnation: str,
    resume: Resume | None,
    epoch: str = "",
    digests: Mapping[str, bytes] | None = None,
) -> pb.Hello:
    """A Join's Hello: a fresh learner (`resume` None; `digests` of its parameters by name,
    `codec.digest`), or one with a past (`epoch`: the syncer epoch its versions came from)."""
    if resume is None:
        return pb.Hello(
            protocol=PROTOCOL, learner=learner, incarnation=incarnation, digests=digests or {}
        )
    return pb.Hello(
        protocol=PROTOCOL,
        learner=learner,
        incarnation=incarnation,
        resume=resume.keep_progress,
        base_versions=list(resume.base_versions),
        latest_versions=list(resume.latest_versions),
        epoch=epoch,
    )


DIGESTS_MAX = 1 << 16  # tensors a Hello may name; more (or odd sizes) and none are used


def digests_from_hello(h: pb.Hello) -> dict[str, bytes]:
    """A fresh learner's parameter digests (never raises: anything odd means none)."""
    d = h.digests
    if len(d) > DIGESTS_MAX or any(len(v) != 16 for v in d.values()):
        return {}
    return dict(d)


def resume_from_hello(h: pb.Hello, epoch: str, known_epochs: Collection[str]) -> Resume | None:
    """What a Hello says of the learner's past (None: a fresh learner), to the syncer of
    `epoch` whose run had `known_epochs` (the core decides: `admission.resume_of`)."""
    return resume_of(h.base_versions, h.latest_versions, h.epoch, epoch, known_epochs, h.resume)


def push_reply(a: PushAnswer) -> pb.PushReply:
    return pb.PushReply(accepted=a.accepted, reason=a.reason, action=a.action, code=a.code)


def beat_reply(epoch: str, known: bool, a: BeatAnswer) -> pb.BeatReply:
    return pb.BeatReply(
        epoch=epoch,
        known=known,
        stop=a.stop,
        budget=a.budget,
        remaining=a.remaining,
        live=a.live,
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


def beat(learner: str, incarnation: str, tokens: int, p: Progress, final: bool = False) -> pb.Beat:
    """A heartbeat: liveness, this incarnation's tokens, and its step report `p`; `final`: the
    learner's last (it has flushed, and its session ending next is a finish, not a loss)."""
    return pb.Beat(
        final=final,
        learner=learner,
        incarnation=incarnation,
        step=p.step,
        tokens=tokens,
        step_time=p.step_time,
        work_s=p.work_s,
    )


def progress_from_beat(b: pb.Beat, now: float) -> Progress:
    return Progress(b.learner, b.step, b.step_time, now, b.work_s)
