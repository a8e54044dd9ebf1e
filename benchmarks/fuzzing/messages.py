"""Family `messages`: protobuf messages parsed from random or mutated bytes, then through the
conversions the syncer and the learner use (wire/convert.py), and the call metadata check
(wire/auth.py AuthInterceptor).

Cases: random bytes parsed as any message type; a message built from random field values
(every field of the descriptor, oneofs, repeated, nested), serialized, optionally mutated, and
parsed as its own type or another; a *valid* message (a real Welcome, header, Hello, Beat) with
fields set to edge values; metadata lists. A clear refusal is the parser's `DecodeError`, a
`convert.MessageError` (learner side: plan, settings, update kind) or the interceptor's
UNAUTHENTICATED; the syncer's readers (contribution_from_header, resume_from_hello,
progress_from_beat) must never raise, and the syncer core must take what they return
(on_join, on_progress, on_contribution) without raising or, for a refused contribution, any
change of its state.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from google.protobuf.descriptor import FieldDescriptor as FD
from google.protobuf.message import DecodeError
from hypothesis import strategies as st

from atoll.core import codec
from atoll.core.learner import LearnerConfig
from atoll.core.messages import Contribution, Progress, Resume
from atoll.wire import PROTOCOL, auth, convert
from atoll.wire import atoll_pb2 as pb
from fuzzing.base import MUTATIONS, Family, Violation, interesting_float, interesting_int, mutate
from fuzzing.world import PLAN, fingerprint, make_syncer

TYPES = (
    "Up",
    "Single",
    "ContributionHeader",
    "Hello",
    "ControlHello",
    "Beat",
    "Down",
    "Welcome",
    "UpdateHeader",
    "ControlDown",
)
WORDS = (
    "",
    "L0",
    "L1",
    "int4",
    "fp32",
    "full",
    "delta",
    "pull",
    "push",
    "overwrite",
    "blend",
    "a",
    "b",
    "emb",
    "\x00",
    "é" * 3,
)
RANGES = {
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
}
NOW = 1000.0


def scalar(f: FD) -> st.SearchStrategy:
    if f.type in RANGES:
        return interesting_int(*RANGES[f.type])
    if f.type == FD.TYPE_DOUBLE:
        return interesting_float()
    if f.type == FD.TYPE_BOOL:
        return st.booleans()
    if f.type == FD.TYPE_STRING:
        return st.one_of(st.sampled_from(WORDS), st.text(max_size=12))
    return st.one_of(st.binary(max_size=48), st.just(codec.encode(torch.ones(9), "int4")))


def fields_of(desc: Any, depth: int) -> st.SearchStrategy[dict]:
    """Random values for a message's fields, as a plain dict (a readable reproducer)."""
    parts = {}
    oneofs = {o.name: [f.name for f in o.fields] for o in desc.oneofs}
    for f in desc.fields:
        if f.type == FD.TYPE_MESSAGE:
            if depth <= 0:
                continue
            v = fields_of(f.message_type, depth - 1)
        else:
            v = scalar(f)
        parts[f.name] = st.lists(v, max_size=4) if f.is_repeated else v
    chosen = {k: st.sampled_from([None, *names]) for k, names in oneofs.items()}

    def keep(d: tuple) -> dict:
        values, picks = d
        out = {}
        for k, v in values.items():
            f = desc.fields_by_name[k]
            if f.containing_oneof is not None and picks[f.containing_oneof.name] != k:
                continue
            out[k] = v
        return out

    names = sorted(parts)
    drop = st.sets(st.sampled_from(names), max_size=len(names)) if names else st.just(set())
    values = st.tuples(st.fixed_dictionaries(parts), st.fixed_dictionaries(chosen))
    return st.tuples(values, drop).map(
        lambda t: {k: v for k, v in keep(t[0]).items() if k not in t[1]}
    )


def fill(msg: Any, values: dict) -> Any:
    for k, v in values.items():
        f = msg.DESCRIPTOR.fields_by_name[k]
        if f.type == FD.TYPE_MESSAGE:
            if f.message_type.GetOptions().map_entry:  # a map: its entries as key/value
                for item in v:
                    getattr(msg, k)[item.get("key", "")] = item.get("value", b"")
            elif f.is_repeated:
                for item in v:
                    fill(getattr(msg, k).add(), item)
            else:
                fill(getattr(msg, k), v)
                getattr(msg, k).SetInParent()
        elif f.is_repeated:
            getattr(msg, k).extend(v)
        else:
            setattr(msg, k, v)
    return msg


def valid_messages() -> dict[str, Any]:
    """One valid message of each kind the syncer or a learner receives."""
    w = convert.welcome(PLAN, LearnerConfig(), "E1", True, 4096, 1 << 20)
    c = Contribution("L0", 1, 3, 0, codec.encode(torch.zeros(9), "int4"), 2, 64, NOW, 0.1)
    h = convert.contribution_header(c, "inc0")
    hello = convert.hello("L0", "inc0", Resume((0, 1, 2), (1, 1, 3)), "E0")
    beat = convert.beat("L0", "inc0", 640, Progress("L0", 10, 0.1, NOW, 1.0))
    u = pb.UpdateHeader(fragment=1, version=2, kind="delta", base_version=1, total_bytes=3)
    return {
        "Welcome": w,
        "ContributionHeader": h,
        "Hello": hello,
        "Beat": beat,
        "UpdateHeader": u,
        "Down": pb.Down(welcome=w),
        "Up": pb.Up(header=h),
        "Single": pb.Single(header=h, payload=c.payload),
        "ControlHello": convert.control_hello("L0", "inc0"),
        "ControlDown": convert.pulls_message([]),
    }


VALID = valid_messages()


def paths(msg: Any, prefix: tuple = ()) -> list[tuple]:
    """Every scalar field of a message, as a path of (field, index) steps."""
    out = []
    for f in msg.DESCRIPTOR.fields:
        if f.type == FD.TYPE_MESSAGE:
            subs = list(getattr(msg, f.name)) if f.is_repeated else [getattr(msg, f.name)]
            for i, sub in enumerate(subs):
                out += paths(sub, prefix + ((f.name, i),))
        else:
            out.append(prefix + ((f.name, None),))
    return out


def walk(msg: Any, path: tuple) -> Any:
    """The message holding the last field of `path`."""
    for name, i in path[:-1]:
        f = msg.DESCRIPTOR.fields_by_name[name]
        msg = getattr(msg, name)[i] if f.is_repeated else getattr(msg, name)
    return msg


def field_at(msg: Any, path: tuple) -> FD:
    return walk(msg, path).DESCRIPTOR.fields_by_name[path[-1][0]]


@st.composite
def edited(draw: Any) -> tuple:
    name = draw(st.sampled_from([n for n in sorted(VALID) if paths(VALID[n])]))
    msg = VALID[name]
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(msg)))
        f = field_at(msg, path)
        value = draw(st.lists(scalar(f), max_size=4) if f.is_repeated else scalar(f))
        edits.append((path, value))
    return ("edited", name, edits, draw(st.one_of(st.just([]), MUTATIONS)))


def apply_edits(msg: Any, edits: list) -> Any:
    out = type(msg)()
    out.CopyFrom(msg)
    for path, value in edits:
        try:
            m = walk(out, path)
        except IndexError:  # an earlier edit chose another member of a oneof
            continue
        k = path[-1][0]
        if m.DESCRIPTOR.fields_by_name[k].is_repeated:
            del getattr(m, k)[:]
            getattr(m, k).extend(value)
        else:
            setattr(m, k, value)
    return out


METADATA_KEYS = (auth.RUN_KEY, auth.TOKEN_KEY, auth.PROTOCOL_KEY, "x-other", "X-ATOLL-RUN")
METADATA_VALUES = ("run1", "secret-123", str(PROTOCOL), "", "secret-12", str(PROTOCOL + 1), "é")


def built(t: str) -> st.SearchStrategy[tuple]:
    values = fields_of(pb.DESCRIPTOR.message_types_by_name[t], 3)
    ops = st.one_of(st.just([]), MUTATIONS)
    return st.tuples(st.just("built"), st.just(t), values, ops, st.sampled_from([t, *TYPES]))


METADATA = st.lists(
    st.tuples(
        st.sampled_from(METADATA_KEYS),
        st.one_of(st.sampled_from(METADATA_VALUES), st.text(max_size=8)),
    ),
    max_size=5,
)
CASES = st.one_of(
    st.tuples(st.just("random"), st.sampled_from(TYPES), st.binary(max_size=200)),
    st.one_of([built(t) for t in TYPES]),
    edited(),
    st.tuples(st.just("metadata"), METADATA),
)


def build(case: tuple) -> tuple[str, bytes]:
    """(type to parse as, bytes) of a case."""
    if case[0] == "random":
        return case[1], case[2]
    if case[0] == "built":
        _, t, values, ops, target = case
        return target, mutate(fill(getattr(pb, t)(), values).SerializeToString(), ops)
    _, name, edits, ops = case
    return name, mutate(apply_edits(VALID[name], edits).SerializeToString(), ops)


def check(case: tuple) -> str:
    if case[0] == "metadata":
        return check_metadata(case[1])
    target, data = build(case)
    try:
        msg = getattr(pb, target).FromString(data)
    except DecodeError:
        return "refused"
    try:
        return convert_one(target, msg)
    except convert.MessageError as exc:
        if not str(exc):
            raise Violation("MessageError without a message") from exc
        return "refused"


def convert_one(t: str, msg: Any) -> str:
    if t in ("ContributionHeader", "Single", "Up"):
        h = msg if t == "ContributionHeader" else msg.header
        if t == "Up" and msg.WhichOneof("body") != "header":
            return "accepted"
        return contribute(h, msg.payload if t == "Single" else b"")
    if t == "Hello":
        return join(msg)
    if t == "Beat":
        return heartbeat(msg)
    if t in ("Welcome", "Down"):
        if t == "Down" and msg.WhichOneof("body") != "welcome":
            if msg.WhichOneof("body") == "update":
                convert.update_from_header(msg.update, msg.update.payload)
            return "accepted"
        return welcome(msg if t == "Welcome" else msg.welcome)
    if t == "UpdateHeader":
        u = convert.update_from_header(msg, msg.payload)
        if u.kind not in convert.UPDATE_KINDS:
            raise Violation(f"update of kind {u.kind!r} accepted")
    if t == "ControlDown":
        convert.pulls_from_message(msg)
    return "accepted"


def contribute(h: Any, payload: bytes) -> str:
    c = convert.contribution_from_header(h, payload, NOW)
    if math.isfinite(h.sent_at) and h.sent_at >= 0 and not NOW - 600 <= c.sent_at <= NOW:
        raise Violation(f"sent_at {h.sent_at} taken as {c.sent_at}, outside the window")
    proto = make_syncer(codec="int4")
    before = fingerprint(proto)
    kinds = [getattr(o, "kind", None) for o in proto.on_contribution(NOW, c)]
    if "refused" in kinds:
        if fingerprint(proto) != before:
            raise Violation("a refused contribution changed the syncer's state", "core/syncer.py")
        return "refused"
    return "accepted"


def join(h: Any) -> str:
    r = convert.resume_from_hello(h, "E1", {"E1", h.epoch})  # any epoch named was this run's
    if r is not None and not all(isinstance(v, int) for v in r.base_versions + r.latest_versions):
        raise Violation(f"resume of non-integers: {r}")
    proto = make_syncer()
    before = fingerprint(proto)[0]
    outs = proto.on_join(NOW, h.learner or "L9", r, h.incarnation)
    if not any(type(o).__name__ == "Send" for o in outs):
        raise Violation("a join was answered with no heal or resume", "core/syncer.py")
    proto.on_lost(NOW, h.learner or "L9")
    if fingerprint(proto)[0] != before:
        raise Violation("a join changed the syncer's durable state", "core/syncer.py")
    return "accepted"


def heartbeat(b: Any) -> str:
    proto = make_syncer()
    proto.on_join(NOW, b.learner or "L9")
    for k, now in ((1, NOW), (2, NOW + 1.0)):
        p = convert.progress_from_beat(b, now)
        proto.on_progress(now, Progress(p.learner or "L9", p.step * k, p.step_time, now, p.work_s))
    return "accepted"


def welcome(w: Any) -> str:
    plan = convert.plan_from_welcome(w)
    cfg = convert.learner_config_from_welcome(w)
    if [f.index for f in plan.fragments] != list(range(plan.P)) or plan.H < 1:
        raise Violation(f"plan accepted with fragments {[f.index for f in plan.fragments]}")
    if any(not 0 <= f.offset < plan.H or f.numel > codec.MAX_NUMEL for f in plan.fragments):
        raise Violation("plan accepted with an offset outside [0, H) or a fragment too large")
    for step in (1, 2, plan.H, plan.H + 1, 2**40):  # what a learner asks at a step boundary
        plan.due(step)
    cfg.validate(plan.H)
    codec.ContributionEncoder(cfg.codec, cfg.group, cfg.error_feedback)  # what a learner does
    return "accepted"


class _Details:
    def __init__(self, md: list) -> None:
        self.method, self.invocation_metadata = "/atoll.v1.Syncer/Heartbeat", tuple(md)


class _Context:
    def abort(self, code: Any, details: str) -> None:
        raise PermissionError(code, details)


def check_metadata(md: list) -> str:
    import grpc

    ic = auth.AuthInterceptor("run1", "secret-123")
    handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: "ok")
    got = ic.intercept_service(lambda details: handler, _Details(md))
    d = dict(md)
    ok = (d.get(auth.RUN_KEY), d.get(auth.TOKEN_KEY), d.get(auth.PROTOCOL_KEY)) == (
        "run1",
        "secret-123",
        str(PROTOCOL),
    )
    if (got is handler) != ok or ic.refused != (0 if ok else 1):
        raise Violation(f"metadata {md}: passed={got is handler}, expected {ok}", "wire/auth.py")
    if ok:
        return "accepted"
    try:
        got.unary_unary(None, _Context())
    except PermissionError as exc:
        if exc.args[0] != grpc.StatusCode.UNAUTHENTICATED or not exc.args[1]:
            raise Violation(f"refused with {exc.args}") from None
        return "refused"
    raise Violation("a refused call was not aborted")


FAMILY = Family(
    "messages",
    CASES,
    check,
    "protobuf DecodeError; convert.MessageError (learner side); UNAUTHENTICATED (metadata)",
    lambda case: 4 * len(build(case)[1]) + 512 * 1024 if case[0] != "metadata" else 256 * 1024,
)
