"""Family `syncer`: contributions into `SyncerProtocol.on_contribution` (the public API only:
on_join, on_contribution, state_dict).

A case builds a syncer (quorum, grace, outer optimizer, codec restriction, down codec drawn),
gives it a prelude of valid contributions (versions move on, rounds stay open), then 1-3
generated contributions: any learner, fragment, seq, base version (current, older, evicted,
negative, huge), counters and times (negative, huge, NaN, inf), and payloads (valid frames of
every scheme at any scale, mutated frames, frames of the wrong size, random bytes), sent
directly or through a ContributionHeader (wire/convert.py). A clear refusal is a `refused`
event with a code and a reason, after which `state_dict()` (and the open rounds) must be bit
for bit what they were before; an accepted one must leave every value finite.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from atoll.core import codec
from atoll.core.messages import Contribution, Refusal
from atoll.wire import atoll_pb2 as pb
from atoll.wire import convert
from fuzzing.base import (
    MUTATIONS,
    Family,
    Violation,
    first_difference,
    interesting_float,
    interesting_int,
    mostly,
    mutate,
)
from fuzzing.frames import FIELDS, edit_header, refit
from fuzzing.world import LEARNERS, PLAN, fingerprint, make_syncer, valid_contribution

OWNER = "core/syncer.py"  # what this family tests (not one of the readers)
CONFIG = st.fixed_dictionaries(
    {
        "quorum": st.integers(1, 2),
        "grace": st.booleans(),
        "outer": st.sampled_from(["sgd", "nesterov", "delayed_nesterov"]),
        "codec": mostly(st.just(""), st.sampled_from(["int4", "fp32"]), share=1),
        "down_codec": st.sampled_from(["fp32", "int8"]),
        "history": st.sampled_from([2, 4, 64]),
        # the round's data path: the reference, or the fused kernels (core/fused.py) for
        # every fragment (their default takes only fragments of 256K values and up)
        "fused": st.sampled_from(["off", "on"]),
    }
)
PRELUDE = st.lists(
    st.tuples(st.sampled_from(LEARNERS), st.integers(0, PLAN.P - 1), st.integers(0, 99)),
    max_size=6,
)
SCALE = st.sampled_from([0.0, 1e-6, 0.01, 1.0, 1e3, 1e20, 3e38])
VALID_PAYLOAD = st.tuples(
    st.just("valid"), st.sampled_from(sorted(codec.SCHEMES)), SCALE, st.integers(0, 99)
)
PAYLOAD = mostly(
    VALID_PAYLOAD,
    st.one_of(
        st.tuples(
            st.just("mutated"),
            st.sampled_from(sorted(codec.SCHEMES)),
            SCALE,
            st.lists(st.tuples(st.sampled_from(sorted(FIELDS)), interesting_int(0)), max_size=2),
            st.one_of(st.just([]), MUTATIONS),
            st.booleans(),
        ),
        st.tuples(st.just("size"), st.sampled_from(sorted(codec.SCHEMES)), st.integers(-9, 9)),
        st.tuples(st.just("random"), st.binary(max_size=120)),
    ),
    share=1,
)
BASE = mostly(
    st.just(("current",)),
    st.one_of(
        st.just(("current",)),
        st.tuples(st.just("back"), st.integers(1, 70)),
        st.tuples(st.just("abs"), interesting_int(-(2**63), 2**64)),
    ),
    share=1,
)


COUNTER = mostly(st.integers(1, 10_000), interesting_int(-(2**63), 2**70))
TIME = mostly(st.floats(0, 100), interesting_float())
CONTRIBUTION = st.fixed_dictionaries(
    {
        "learner": mostly(st.sampled_from(LEARNERS), st.sampled_from(["L9", "", "L0 "])),
        "fragment": mostly(st.integers(0, PLAN.P - 1), interesting_int(-(2**63), 2**64)),
        "seq": interesting_int(-(2**63), 2**64),
        "base": BASE,
        "payload": PAYLOAD,
        "steps": COUNTER,
        "tokens": mostly(st.integers(1, 10**6), interesting_int(-(2**63), 2**70)),
        "sent_at": TIME,
        "step_time": mostly(st.floats(0, 10), interesting_float()),
        "work_s": TIME,
        "now": st.one_of(st.floats(0, 1e6), st.sampled_from([0.0, 1e300])),
        "wire": st.booleans(),
    }
)
REAL_KEYS = ("learner", "fragment", "seq", "base", "payload", "steps", "tokens", "sent_at",
             "step_time", "work_s", "now", "wire")  # fmt: skip
# a contribution a well-behaved learner sends (the accept path: rounds close, values merge)
REAL = st.fixed_dictionaries(
    {
        "learner": st.sampled_from(LEARNERS),
        "fragment": st.integers(0, PLAN.P - 1),
        "seq": st.integers(0, 10**6),
        "base": st.one_of(st.just(("current",)), st.tuples(st.just("back"), st.integers(1, 3))),
        "payload": st.tuples(
            st.just("valid"),
            st.sampled_from(sorted(codec.SCHEMES)),
            st.sampled_from([0.0, 1e-6, 0.01, 0.1]),
            st.integers(0, 99),
        ),
        "steps": st.integers(1, 64),
        "tokens": st.integers(1, 64 * 4096),
        "sent_at": st.floats(0, 100),
        "step_time": st.floats(0, 10),
        "work_s": st.floats(0, 100),
        "now": st.floats(0, 1e6),
        "wire": st.booleans(),
    }
)
# ... and one with a single field gone wrong (structure-aware: every check in turn)
ONE_FIELD = st.tuples(REAL, st.sampled_from(sorted(set(REAL_KEYS) - {"wire"})), CONTRIBUTION).map(
    lambda t: {**t[0], t[1]: t[2][t[1]]}
)
SEND = st.one_of(REAL, ONE_FIELD, CONTRIBUTION)
CASES = st.tuples(CONFIG, PRELUDE, st.lists(SEND, min_size=1, max_size=3))


def numel_of(p: int) -> int:
    return PLAN.fragments[p].numel if 0 <= p < PLAN.P else 9


def payload_of(spec: tuple, p: int) -> bytes:
    n = numel_of(p)
    kind = spec[0]
    if kind == "random":
        return spec[1]
    if kind == "size":
        return codec.encode(torch.ones(max(0, n + spec[2])), spec[1])
    scheme, scale = spec[1], spec[2]
    seed = spec[3] if kind == "valid" else 7
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale
    try:
        frame = codec.encode(x.clamp(-3e38, 3e38), scheme)
    except codec.CodecError:
        frame = codec.encode(x.clamp(-1e38, 1e38), scheme)
    if kind == "mutated":
        _, _, _, edits, ops, fix = spec
        frame = refit(mutate(edit_header(frame, edits), ops), fix, fix)
    return frame


def base_of(spec: tuple, proto: Any, p: int) -> int:
    if spec[0] == "abs":
        return spec[1]
    v = proto.state_dict()["fragments"][p]["version"] if 0 <= p < PLAN.P else 0
    return v if spec[0] == "current" else v - spec[1]


def through_wire(c: Contribution, now: float) -> Contribution | None:
    """The contribution as the live syncer gets it, when its numbers fit the header's types."""
    try:
        h = convert.contribution_header(c, "inc0")
        h2 = pb.ContributionHeader.FromString(h.SerializeToString())
    except (ValueError, TypeError, OverflowError):
        return None
    return convert.contribution_from_header(h2, c.payload, now)


def contribution(d: dict, proto: Any) -> Contribution:
    p = d["fragment"]
    return Contribution(
        d["learner"],
        p,
        d["seq"],
        base_of(d["base"], proto, p),
        payload_of(d["payload"], p),
        d["steps"],
        d["tokens"],
        d["sent_at"],
        d["step_time"],
        d["work_s"],
    )


def check(case: tuple) -> str:
    cfg, prelude, sends = case
    proto = make_syncer(**cfg)
    for i, (lid, p, seed) in enumerate(prelude):
        proto.on_contribution(1.0 + i, valid_contribution(proto, lid, p, 100 + i, seed=seed))
    outcome = "accepted"
    for d in sends:
        c = contribution(d, proto)
        if d["wire"]:
            c = through_wire(c, d["now"]) or c
        before = fingerprint(proto)
        outs = proto.on_contribution(d["now"], c)
        kinds = {getattr(o, "kind", None): o for o in outs}
        if "refused" in kinds:
            r = kinds["refused"].data
            if r.code not in {x.value for x in Refusal} or not r.reason:
                raise Violation(f"refusal without a known code and a reason: {r}", OWNER)
            after = fingerprint(proto)
            if after != before:
                where = first_difference(before, after)
                raise Violation(
                    f"a refused contribution ({r.code}) changed the state at {where}", OWNER
                )
            outcome = "refused"
        elif "accepted" in kinds:
            st = proto.state_dict()
            for f in st["fragments"]:
                if not all(bool(torch.isfinite(f[k]).all()) for k in ("theta", "public")):
                    raise Violation(
                        f"fragment {f['fragment']} is not finite after an accept", OWNER
                    )
            outcome = "accepted"
        else:
            raise Violation(f"neither accepted nor refused: {sorted(map(str, kinds))}", OWNER)
    return outcome


FAMILY = Family(
    "syncer",
    CASES,
    check,
    "a `refused` event (code, reason) with state_dict() bit-identical",
    lambda case: 1024 * 1024,
)
