"""Regression tests for the reliability defects of issue 9 (the defect numbers are in the
section comments), against the core state machine: refused frames, merges that overflow, the
pull clock, lost-round claims, error feedback, reconnect storms. Each fails on the code
before its fix. The same defects against the live syncer: tests/integration/
test_reliability_service.py."""

from __future__ import annotations

import torch

from atoll.core import codec
from atoll.core.events import Event
from atoll.core.messages import Contribution, Progress, PullTick, Resume, SetTimer
from atoll.core.syncer import SyncerProtocol
from atoll.model.recipe import builtin_plan
from tests.helpers import CFG


def kinds(out, kind):
    return [o.data for o in out if isinstance(o, Event) and o.kind == kind]


def core(**kw) -> SyncerProtocol:
    plan, init = builtin_plan(CFG)
    import dataclasses

    cfg = dataclasses.replace(CFG.syncer_config(), **kw)
    s = SyncerProtocol(plan, init, cfg)
    for lid in ("L0", "L1"):
        s.on_join(0.0, lid)
    return s


def contribution(s, lid, p=0, value=None, step_time=0.1, steps=1, tokens=64, seq=1):
    n = s.plan.fragments[p].numel
    delta = torch.full((n,), value) if value is not None else 1e-3 * torch.randn(n)
    return Contribution(lid, p, seq, 0, codec.encode(delta, "int4"), steps, tokens, 1.0, step_time)


def state_bits(s) -> list:
    st = s.state_dict()
    return [
        st["rounds_closed"],
        [(f["version"], f["theta"].clone(), f["public"].clone()) for f in st["fragments"]],
    ]


def same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    return all(
        va == vb and torch.equal(ta, tb) and torch.equal(pa, pb_)
        for (va, ta, pa), (vb, tb, pb_) in zip(a[1], b[1])
    )


# -- issue 9, defect 3: huge finite int4 values ----------------------------------------------------
def test_huge_finite_int4_frames_are_refused_and_leave_the_state_bit_identical():
    s = core()
    before = state_bits(s)
    for lid in ("L0", "L1"):
        out = s.on_contribution(1.0, contribution(s, lid, value=-3e38))
        assert [r.code for r in kinds(out, "refused")] == ["magnitude"], out
    assert same(before, state_bits(s)) and s.version == [0, 0, 0]


def test_a_merge_that_overflows_never_commits_even_with_the_guard_off():
    """With Nesterov, two deltas of -3e38 overflow the outer step to inf; the version used to
    move with no round event and no tape record (every later Join failed)."""
    s = core(guard=0.0, outer="nesterov", outer_lr=0.7)
    before = state_bits(s)
    out = s.on_contribution(1.0, contribution(s, "L0", value=-3e38))
    out += s.on_contribution(1.0, contribution(s, "L1", value=-3e38))
    assert not kinds(out, "round_closed") and len(kinds(out, "merge_refused")) == 1
    assert same(before, state_bits(s)) and s.version == [0, 0, 0]
    assert all(bool(torch.isfinite(t).all()) for t in s.theta)
    # the round is over: honest contributions merge as usual afterwards
    out = s.on_contribution(2.0, contribution(s, "L0", seq=2))
    out += s.on_contribution(2.0, contribution(s, "L1", seq=2))
    assert len(kinds(out, "round_closed")) == 1 and s.version[0] == 1


def test_guard_takes_ordinary_deltas_and_refuses_an_outlier_once_warm():
    s = core(quorum=1)
    for i in range(12):  # warm: the guard has seen what this run's deltas look like
        out = s.on_contribution(1.0 + i, contribution(s, "L0", seq=i + 1))
        assert not kinds(out, "refused"), out
        base = s.version[0]
    n = s.plan.fragments[0].numel
    big = Contribution(
        "L1", 0, 1, base, codec.encode(0.5 * torch.randn(n), "int4"), 1, 64, 20.0, 0.1
    )
    out = s.on_contribution(20.0, big)
    assert [r.code for r in kinds(out, "refused")] == ["magnitude"]


# -- issue 9, defect 4: a step time of 1e300 -------------------------------------------------------
def _pull_period(s, now) -> float:
    timers = [o for o in s.on_timer(now, PullTick(s.tick)) if isinstance(o, SetTimer)]
    return timers[0].at - now


def test_a_huge_step_time_cannot_freeze_the_pull_clock():
    s = core()
    s.on_listening(0.0, "L0", True)
    s.on_progress(0.5, Progress("L0", 1, 0.1, 0.5, 0.1))
    out = s.on_contribution(1.0, contribution(s, "L0", step_time=1e300))
    assert [r.code for r in kinds(out, "refused")] == ["header"]
    s.on_progress(1.0, Progress("L0", 2, 1e300, 1.0, 0.2))  # ignored
    s.on_progress(1.1, Progress("L0", 3, 3000.0, 1.1, 0.3))  # within bounds: moves it a bit
    assert _pull_period(s, 2.0) < 1.0  # before the fix: 1e300 s (never again)


# -- issue 9, defect 6: a crafted Join -------------------------------------------------------------
def test_an_implausible_seen_claim_does_not_count_as_lost_rounds():
    s = core()
    P = s.plan.P
    r = Resume((0,) * P, (10**12,) * P, other_epoch=True, keep_progress=True)
    out = s.on_join(1.0, "L9", r)
    checks = kinds(out, "seen_check")
    assert checks[0].lost_committed_rounds == 0 and "implausible" in checks[0].implausible
    short = Resume((0,), (5,), other_epoch=True, keep_progress=True)  # wrong length: heals
    out = s.on_join(2.0, "L8", short)
    assert kinds(out, "joined")[0].learner == "L8"


# -- issue 9, defect 11: the encoder's error feedback on a fragment that stops changing ------------
def test_error_feedback_survives_a_fragment_that_stops_changing():
    """Its residual shrinks ~14x per int4 frame; once a group's scale underflowed bf16 the
    sender's own copy of what it sent became NaN and every later frame was refused (the
    upload thread died around step 1,000-2,000 of `learners=1 steps=4000`)."""
    ef = codec.ErrorFeedback("int4", 64)
    ef.encode(0, 1e-3 * torch.randn(256))
    for _ in range(200):
        frame = ef.encode(0, torch.zeros(256))
        assert bool(torch.isfinite(ef.residual[0]).all())
    assert torch.equal(codec.decode(frame), torch.zeros(256))
    x = torch.zeros(128)
    x[3], x[70] = 1e-41, 0.5  # one group of a subnormal absmax
    frame, sent = codec._encode(x, "int4", 64, want_sent=True)
    assert torch.equal(sent, codec.decode(frame))


# -- load: reconnect storms, sessions that never listen ------------------------------------------
def test_a_storm_of_rejoins_encodes_each_heal_frame_once():
    s = core()
    first = s.heal_message()
    again = s.heal_message()
    assert all(a.payload is b.payload for a, b in zip(first.updates, again.updates))


def test_a_session_that_never_listens_does_not_hold_rounds_open():
    """Pull schedule, quorum 1 with a grace window: a round closes once every learner that
    can hear pulls has sent; before, a joined session without a Pulls stream (a client
    that rejoins in a loop) kept every round open for the whole window."""
    s = core(quorum=1, grace=True)
    s.on_join(0.0, "storm", listening=False)
    s.grace.step.value, s.grace.to_quorum.value, s.grace.sync.value = 1.0, 0.0, 0.0
    out = s.on_contribution(1.0, contribution(s, "L0"))
    assert not kinds(out, "round_closed")  # L1 listens: the window waits for it
    out = s.on_contribution(1.1, contribution(s, "L1"))
    assert len(kinds(out, "round_closed")) == 1  # not waiting for "storm"
