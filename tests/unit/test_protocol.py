"""The learner and syncer state machines, driven by hand with explicit times."""

import pytest
import torch

from atoll.core import codec
from atoll.core.events import Event
from atoll.core.fragments import make_plan
from atoll.core.learner import LearnerConfig, LearnerProtocol
from atoll.core.messages import (
    Contribution,
    FragmentUpdate,
    Heal,
    PullTick,
    SetTimer,
)
from atoll.core.syncer import SyncerConfig, SyncerProtocol
from atoll.errors import ConfigError
from tests.helpers import SHAPES, encoded, sends, setup, step


def test_learner_sends_scheduled_fragment_with_counters():
    plan, syncer, (l0, _) = setup()
    l0.params["a"] += 1.0  # local progress on fragment of "a"
    out = step(l0, 1.0, tokens=100, step_time=1.0)
    assert len(out) == 1
    c = out[0].message
    assert isinstance(c, Contribution) and c.steps == 1 and c.tokens == 100
    delta = codec.decode(c.payload)
    assert torch.allclose(delta, l0.base[c.fragment] - plan.flatten(l0.params, c.fragment))


def test_quorum_one_closes_at_once_and_merge_applies_outer_step():
    plan, syncer, (l0, l1) = setup(quorum=1)
    p = plan.due(1)[0]
    name = plan.fragments[p].names[0]
    l0.params[name] += 2.0
    c = step(l0, 1.0, 10, 1.0)[0].message
    out = syncer.on_contribution(1.1, c)
    updates = sends(out)
    assert {s.to for s in updates} == {"L0", "L1"}
    closed = [o for o in out if isinstance(o, Event) and o.kind == "round_closed"][0]
    assert closed.data["participants"] == ["L0"]
    # outer sgd with lr 1 and one learner: the global value becomes the learner's value
    assert torch.allclose(syncer.theta[p], plan.flatten(l0.params, p))


def test_quorum_two_waits_for_second_learner_and_weights_by_tokens():
    plan, syncer, (l0, l1) = setup(quorum=2, merge="mean")
    p = plan.due(1)[0]
    name = plan.fragments[p].names[0]
    l0.params[name] += 1.0
    l1.params[name] += 4.0
    c0 = step(l0, 1.0, 300, 1.0)[0].message  # 300^2/1 = 90000
    c1 = step(l1, 1.0, 100, 1.0)[0].message  # 100^2/1 = 10000
    assert sends(syncer.on_contribution(1.1, c0)) == []
    out = syncer.on_contribution(1.2, c1)
    assert len(sends(out)) == 2
    expected = 0.9 * 1.0 + 0.1 * 4.0
    assert torch.allclose(
        syncer.theta[p][: plan.fragments[p].numels[0]],
        torch.full((plan.fragments[p].numels[0],), expected),
    )


def test_grace_window_keeps_round_open_then_timer_closes_it():
    plan, syncer, (l0, l1) = setup(quorum=1, grace=True, n=2, tau=1)
    syncer.grace.step.update(1.0)  # measured step time 1 s, tau=1 -> slack 1 s, window 0.5 s
    c = step(l0, 1.0, 10, 1.0)[0].message
    out = syncer.on_contribution(1.0, c)
    timers = [o for o in out if isinstance(o, SetTimer)]
    assert len(timers) == 1 and not sends(out)
    assert 1.0 < timers[0].at <= 2.0
    # second learner arrives inside the window: everyone is in, the round closes at once
    c1 = step(l1, 1.2, 10, 1.0)[0].message
    out = syncer.on_contribution(1.3, c1)
    closed = [o for o in out if isinstance(o, Event) and o.kind == "round_closed"][0]
    assert closed.data["participants"] == ["L0", "L1"]
    assert syncer.on_timer(timers[0].at, timers[0].key) == []  # stale timer does nothing


def test_learner_blocks_until_answer_then_applies_after_tau():
    plan, syncer, (l0, l1) = setup(quorum=2, tau=1)
    c0 = step(l0, 1.0, 10, 1.0)[0].message
    assert l0.blocked() == []  # tau=1: one more step may run while the fragment travels
    step(l0, 2.0, 10, 1.0)
    assert c0.fragment in l0.blocked()  # ... but not two
    out = syncer.on_contribution(1.1, c0)
    assert not sends(out)
    c1 = step(l1, 1.0, 10, 1.0)[0].message
    for s in sends(syncer.on_contribution(1.2, c1)):
        [l0, l1][int(s.to[1])].on_update(1.3, s.message)
    assert c0.fragment not in l0.blocked()
    events = l0.apply_due(2.3)
    assert [e.data["fragment"] for e in events if e.kind == "applied"] == [c0.fragment]
    assert l0.counters.steps[c0.fragment] == 0


def test_on_update_with_a_decoded_value_matches_decoding_the_payload():
    """A driver may decode the payload itself (in its communication thread) and pass the
    tensor: the learner ends in the same state, and a value of the wrong size is refused."""
    runs = []
    for pass_value in (False, True):
        plan, syncer, (l0, _) = setup(quorum=1, tau=1, codec_name="int4")
        c = step(l0, 1.0, 10, 1.0)[0].message
        upd = sends(syncer.on_contribution(1.1, c))[0].message
        p = upd.fragment
        value = codec.decode(upd.payload, plan.fragments[p].numel) if pass_value else None
        if pass_value:
            with pytest.raises(codec.CodecError):
                l0.on_update(1.2, upd, torch.zeros(plan.fragments[p].numel + 1))
        l0.on_update(1.2, upd, value)
        assert l0.outstanding[p].answered
        step(l0, 2.0, 10, 1.0)
        l0.apply_due(2.1)
        runs.append(l0)
    a, b = runs
    assert a.latest_version == b.latest_version and a.base_version == b.base_version
    assert all(torch.equal(x, y) for x, y in zip(a.latest, b.latest, strict=True))
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)


def test_carry_keeps_local_progress_since_send():
    plan, syncer, (l0, _) = setup(quorum=1, receipt="carry", n=2, tau=1)
    c = step(l0, 1.0, 10, 1.0)[0].message
    p = c.fragment
    name = plan.fragments[p].names[0]
    upd = sends(syncer.on_contribution(1.1, c))[0].message
    l0.on_update(1.2, upd)
    l0.params[name] += 0.5  # progress made during the overlap
    l0.apply_due(1.3)
    assert torch.allclose(l0.params[name], torch.full_like(l0.params[name], 0.5))


def test_refused_contributions_leave_global_state_untouched():
    plan, syncer, (l0, _) = setup()
    c = step(l0, 1.0, 10, 1.0)[0].message
    before = [t.clone() for t in syncer.theta]
    bad = [
        Contribution(**{**c.__dict__, "payload": c.payload[:-1] + bytes([c.payload[-1] ^ 1])}),
        Contribution(**{**c.__dict__, "base_version": 99}),
        Contribution(**{**c.__dict__, "fragment": 7}),
        Contribution(**{**c.__dict__, "learner": "stranger"}),
        Contribution(**{**c.__dict__, "payload": codec.encode(torch.ones(99), "fp32")}),
    ]
    for b in bad:
        out = syncer.on_contribution(1.1, b)
        assert [o.kind for o in out if isinstance(o, Event)] == ["refused"]
        assert out[0].data["reason"]
    assert all(torch.equal(a, b) for a, b in zip(before, syncer.theta))
    assert syncer.rounds_closed == 0


def test_delta_broadcast_keeps_exact_global_and_tracks_it_on_learners():
    plan, syncer, (l0, l1) = setup(quorum=1, down_codec="int4", n=2)
    g = torch.Generator().manual_seed(0)
    for k in range(1, 41):
        for lp in (l0, l1):
            for t in lp.params.values():
                t += 0.01 * torch.randn(t.shape, generator=g)
            for s in step(lp, float(k), 10, 1.0):
                for o in sends(syncer.on_contribution(k + 0.1, s.message)):
                    [l0, l1][int(o.to[1])].on_update(k + 0.2, o.message)
            lp.apply_due(k + 0.3)
    for p in range(plan.P):
        assert l0.latest_version[p] == syncer.version[p]
        # learners' copy equals the syncer's public copy exactly, and tracks the exact value
        assert torch.equal(l0.latest[p], syncer.public[p])
        err = (syncer.public[p] - syncer.theta[p]).abs().max()
        assert err <= codec.error_bound(syncer.theta[p], "int4").max() * 2 + 1e-6


def test_stepping_before_heal_is_an_error():
    plan = make_plan(SHAPES, P=2, H=2)
    lp = LearnerProtocol(
        "L0", plan, {k: torch.zeros(s) for k, s in SHAPES.items()}, LearnerConfig(tau=1)
    )
    with pytest.raises(RuntimeError, match="heal"):
        step(lp, 0.0, 1, 1.0)


def test_heal_overwrites_local_parameters():
    plan, syncer, (l0, _) = setup(heal_codec="fp32")  # exact copies (int8: test_pacing_heals)
    syncer.theta[0] += 3.0
    syncer.public[0] = syncer.theta[0].clone()
    l0.params[plan.fragments[0].names[0]] += 100.0
    l0.on_heal(5.0, syncer.heal_message())
    assert torch.allclose(plan.flatten(l0.params, 0), syncer.theta[0])
    assert isinstance(syncer.heal_message(), Heal)
    assert all(
        isinstance(u, FragmentUpdate) and u.kind == "full" for u in syncer.heal_message().updates
    )


def test_pull_schedule_paces_rounds_by_measured_step_time():
    plan, syncer, (l0, l1) = setup(schedule="pull", quorum=2)
    out = step(l0, 0.5, 10, 0.5)  # no pull yet: only a progress report
    assert [type(o.message).__name__ for o in out] == ["Progress"]
    timers = [o for o in syncer.on_progress(0.6, out[0].message) if isinstance(o, SetTimer)]
    assert timers and timers[0].key == PullTick(0)
    pulls = syncer.on_timer(0.6, timers[0].key)
    sent = sends(pulls)
    assert {s.to for s in sent} == {"L0", "L1"}
    frag = sent[0].message.fragment
    assert frag == plan.due(1)[0]
    nxt = [o for o in pulls if isinstance(o, SetTimer)][0]
    assert nxt.key == PullTick(1) and nxt.at == pytest.approx(0.6 + 0.5)
    for s in sent:
        [l0, l1][int(s.to[1])].on_pull(0.7, s.message)
    # each learner answers at its next step boundary, whatever its step count
    c0 = [o.message for o in step(l0, 1.0, 10, 0.5) if isinstance(o.message, Contribution)]
    c1 = [o.message for o in encoded(l1, l1.take_pulled(1.3))]
    assert [c.fragment for c in c0] == [frag] and [c.fragment for c in c1] == [frag]
    assert c0[0].steps == 2 and c1[0].steps == 0
    assert not sends(syncer.on_contribution(1.1, c0[0]))
    closed = [
        o
        for o in syncer.on_contribution(1.4, c1[0])
        if isinstance(o, Event) and o.kind == "round_closed"
    ]
    assert closed and closed[0].data["participants"] == ["L0", "L1"]


@pytest.mark.parametrize(
    "kw,key",
    [
        ({"schedule": "sometimes"}, "schedule"),
        ({"merge": "median"}, "merge"),
        ({"down_codec": "int3"}, "down_codec"),
        ({"history": 1}, "history"),
    ],
)
def test_bad_syncer_settings_name_the_setting(kw, key):
    plan = make_plan(SHAPES, P=2, H=2)
    with pytest.raises(ConfigError) as err:
        SyncerProtocol(plan, [torch.zeros(4), torch.zeros(3)], SyncerConfig(**kw))
    assert err.value.setting == key
