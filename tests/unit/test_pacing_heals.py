"""The pull schedule's answer window (core/pacing.py) and heals that leave out what a fresh
learner already holds (digests in its Hello), on the core state machines."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from atoll.config import SimConfig
from atoll.core import codec
from atoll.core.events import Event
from atoll.core.learner import LearnerProtocol
from atoll.core.messages import (
    CloseRound,
    Contribution,
    Heal,
    Progress,
    Pull,
    PullTick,
    Send,
    SetTimer,
)
from atoll.core.syncer import SyncerProtocol
from atoll.model.recipe import builtin_plan

CFG = SimConfig(
    learners=3, P=3, H=3, tau=2, quorum=1, grace=True, codec="int4", schedule="pull",
    n_layer=1, d_model=8, n_head=2, context=8, batch=2, data_bytes=200_000, eval_batches=1,
)  # fmt: skip


def syncer(**kw) -> SyncerProtocol:
    plan, init = builtin_plan(CFG)
    return SyncerProtocol(plan, init, dataclasses.replace(CFG.syncer_config(), **kw))


def closed(out) -> list:
    return [o.data for o in out if isinstance(o, Event) and o.kind == "round_closed"]


def answer(s, lid, p, t, step_time=1.0):
    n = s.plan.fragments[p].numel
    payload = codec.encode(1e-3 * torch.randn(n), "int4")
    return s.on_contribution(t, Contribution(lid, p, 1, 0, payload, 1, 64, t - 0.01, step_time))


def started(s, ids, step_times):
    for lid in ids:
        s.on_join(0.0, lid)
    out = []
    for lid, st in zip(ids, step_times, strict=True):
        out += s.on_progress(0.5, Progress(lid, 1, st, 0.5, st))
    return out


def test_a_pulled_round_waits_for_every_learner_within_its_answer_window():
    """Three learners, one 1.5x slower: all three answers arrive within a step and a half of
    the pull, and they make one round. Before, the round closed a grace window after the
    first answer (here 0.5 s: gamma * slack) and each late answer made a round of its own."""
    s = syncer()
    out = started(s, ["L0", "L1", "L2"], [1.0, 1.0, 1.5])
    assert [o.key for o in out if isinstance(o, SetTimer)] == [PullTick(0)]
    out = s.on_timer(1.0, PullTick(0))
    pulls = [o for o in out if isinstance(o, Send) and isinstance(o.message, Pull)]
    p = pulls[0].message.fragment
    deadline = [o.at for o in out if isinstance(o, SetTimer) and isinstance(o.key, CloseRound)]
    assert deadline and deadline[0] >= 1.0 + 1.5  # the slowest learner's step time
    assert not closed(answer(s, "L0", p, 1.3))
    assert not closed(answer(s, "L1", p, 1.9))  # past the old grace window
    rounds = closed(answer(s, "L2", p, 2.4))  # everyone: at once
    assert len(rounds) == 1 and rounds[0].participants == ["L0", "L1", "L2"]


def test_at_the_deadline_the_round_closes_and_a_late_answer_is_merged_alone():
    s = syncer()
    started(s, ["L0", "L1"], [1.0, 1.0])
    out = s.on_timer(1.0, PullTick(0))
    p = next(o.message.fragment for o in out if isinstance(o, Send))
    (at,) = [o.at for o in out if isinstance(o, SetTimer) and isinstance(o.key, CloseRound)]
    answer(s, "L0", p, 1.2)
    rounds = closed(s.on_timer(at, CloseRound(p, s.round_id[p])))
    assert len(rounds) == 1 and rounds[0].participants == ["L0"]
    out = answer(s, "L1", p, at + 5.0)  # far too late: the push rule (quorum, grace window)
    assert closed(out) or any(isinstance(o, SetTimer) for o in out)


def test_without_grace_a_pulled_round_closes_at_the_quorum():
    s = syncer(grace=False)
    started(s, ["L0", "L1"], [1.0, 1.0])
    out = s.on_timer(1.0, PullTick(0))
    assert not [o for o in out if isinstance(o, SetTimer) and isinstance(o.key, CloseRound)]
    p = next(o.message.fragment for o in out if isinstance(o, Send))
    assert len(closed(answer(s, "L0", p, 1.2))) == 1


def _learner(s, lid="L9"):
    model_params = {n: t.clone() for n, t in zip(*_named(s), strict=True)}
    return LearnerProtocol(lid, s.plan, model_params, CFG.learner_config()), model_params


def _named(s):
    names, tensors = [], []
    for p, f in enumerate(s.plan.fragments):
        names += list(f.names)
        tensors += list(s.plan.split(p, s.public[p]))
    return names, tensors


def test_a_fresh_learner_holding_the_global_weights_is_healed_without_payload():
    s = syncer()
    names, tensors = _named(s)
    digests = {n: codec.digest(t) for n, t in zip(names, tensors, strict=True)}
    (heal,) = [o.message for o in s.on_join(0.0, "L9", digests=digests) if isinstance(o, Send)]
    assert isinstance(heal, Heal) and {u.kind for u in heal.updates} == {"held"}
    assert heal.nbytes == 0
    lp, params = _learner(s)
    before = {n: t.clone() for n, t in params.items()}
    lp.on_heal(0.0, heal)
    assert lp.base_version == s.version and lp.healed
    assert all(torch.equal(params[n], before[n]) for n in params)


def test_a_heal_sends_in_full_what_changed_and_what_does_not_match():
    s = syncer()
    names, tensors = _named(s)
    digests = {n: codec.digest(t) for n, t in zip(names, tensors, strict=True)}
    s.on_join(0.0, "L0")
    answer(s, "L0", 0, 1.0)
    s.close_all(2.0)  # fragment 0 moves to version 1
    assert s.version[0] == 1
    (heal,) = [o.message for o in s.on_join(3.0, "L9", digests=digests) if isinstance(o, Send)]
    kinds = {u.fragment: u.kind for u in heal.updates}
    assert kinds[0] == "full" and all(kinds[p] == "held" for p in range(1, s.plan.P))
    wrong = {n: b"\0" * 16 for n in digests}
    (heal,) = [o.message for o in s.on_join(3.0, "L8", digests=wrong) if isinstance(o, Send)]
    assert {u.kind for u in heal.updates} == {"full"}
    assert heal.nbytes == s.heal_message().nbytes > 0


def test_a_heal_prepared_before_the_lock_is_only_looked_up_by_the_join(monkeypatch):
    """`prepare_heal` encodes and digests outside the driver's lock; `on_join` then encodes
    nothing (at 100M parameters that took over a second under the lock, and learners joining
    together were dropped as silent). A fragment merged in between is encoded again."""
    s = syncer()
    names, tensors = _named(s)
    wrong = {n: b"\0" * 16 for n in names}  # a learner holding other weights: all in full
    want = [o.message for o in syncer().on_join(0.0, "L9", digests=wrong) if isinstance(o, Send)]
    s.prepare_heal(wrong)
    real = codec.encode
    calls = []
    monkeypatch.setattr(codec, "encode", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setattr(codec, "digest", lambda t: pytest.fail("digested under the lock"))
    (heal,) = [o.message for o in s.on_join(0.0, "L9", digests=wrong) if isinstance(o, Send)]
    assert calls == [] and heal == want[0]  # the same frames, none encoded by the join
    monkeypatch.setattr(codec, "encode", real)
    answer(s, "L9", 0, 1.0)
    s.close_all(2.0)  # fragment 0 is replaced: its cached frame no longer matches
    monkeypatch.setattr(codec, "encode", lambda *a, **k: calls.append(a) or real(*a, **k))
    (heal,) = [o.message for o in s.on_join(3.0, "L8") if isinstance(o, Send)]
    assert len(calls) == 1 and heal.updates[0].version == 1


def test_a_heal_is_int8_by_default_a_quarter_of_fp32_and_its_error_stays_in_the_copy():
    """heal_codec: a whole fragment goes int8 (the learner's copy is within the codec's
    bound of the public value), or fp32 (exact). Theta is never touched by it."""
    sent = {}
    for scheme in ("int8", "fp32"):
        s = syncer(heal_codec=scheme)
        (heal,) = [o.message for o in s.on_join(0.0, "L9") if isinstance(o, Send)]
        assert {codec.peek(u.payload)[0] for u in heal.updates} == {scheme}
        theta = [t.clone() for t in s.theta]
        lp, params = _learner(s)
        for t in params.values():
            t.add_(1.0)  # whatever it held is overwritten
        lp.on_heal(0.0, heal)
        for p in range(s.plan.P):
            got = torch.cat([params[n].flatten() for n in s.plan.fragments[p].names])
            if scheme == "fp32":
                assert torch.equal(got, s.public[p])
            else:
                err = (got - s.public[p]).abs()
                assert bool((err <= codec.error_bound(s.public[p], "int8")).all())
                assert float(err.max()) > 0  # lossy: the copy is not the public value
            assert torch.equal(s.theta[p], theta[p])
        sent[scheme] = heal.nbytes
    assert sent["int8"] < 0.3 * sent["fp32"], sent


def test_a_link_slower_than_the_overlap_is_reported_once_as_the_bottleneck():
    s = syncer()
    started(s, ["L0", "L1"], [1.0, 1.0])
    n = s.plan.fragments[0].numel

    def upload(lid, t, took):
        c = Contribution(lid, 0, 1, 0, codec.encode(1e-3 * torch.randn(n), "int4"), 1, 64,
                         t - took, 1.0)  # fmt: skip
        return [o.data for o in s.on_contribution(t, c) if isinstance(o, Event)
                and o.kind == "link_bottleneck"]  # fmt: skip

    assert upload("L0", 1.0, 0.1) == [] and upload("L1", 1.0, 0.1) == []
    seen = [upload("L1", 10.0 + k, 3.0) for k in range(10)]  # 3 s against tau * step = 2 s
    hits = [e for evs in seen for e in evs]
    assert len(hits) == 1 and hits[0].learner == "L1"  # once, when the average crossed 2 s
    assert 2.0 < hits[0].upload_s < 3.0 and hits[0].overlap_s == 2.0
    assert not any(upload("L0", 30.0, 0.1) for _ in range(3))  # the other link is fine
    for k in range(12):  # back to 0.1 s uploads: below half the overlap, then slow again
        upload("L1", 30.0 + k, 0.1)
    assert sum(len(upload("L1", 50.0 + k, 3.0)) for k in range(10)) == 1
