"""The decisions the core now owns for both drivers: resume or heal, the lost-round check,
step reports covering many steps, coalescing, closing every round, the final flush and its
work accounting, typed refusals, and state in and out (state_dict / load_state_dict)."""

import json
import math

import pytest
import torch

from atoll.core import codec
from atoll.core.events import KINDS, Event
from atoll.core.learner import HealRequest, LearnerConfig, LearnerProtocol
from atoll.core.messages import (
    Contribution,
    FragmentUpdate,
    Heal,
    Outgoing,
    Progress,
    PushAnswer,
    Refusal,
    Resume,
    Resumed,
    Send,
)
from atoll.core.syncer import PROGRESS_STEPS_MAX
from atoll.errors import ConfigError
from tests.helpers import SHAPES, encoded, sends, setup, step


def _contrib(plan, lid, p, seq, base, value=0.01, **kw):
    payload = codec.encode(torch.full((plan.fragments[p].numel,), value), "fp32")
    fields = dict(steps=1, tokens=10, sent_at=1.0, step_time=1.0)
    fields.update(kw)
    return Contribution(lid, p, seq, base, payload, **fields)


def _merge_some(plan, syncer, rounds=3):
    for i in range(rounds):
        p = i % plan.P
        syncer.on_contribution(1.0 + i, _contrib(plan, "L0", p, i + 1, syncer.version[p]))


def test_join_resumes_when_bases_are_held_and_heals_otherwise():
    plan, syncer, _ = setup()
    _merge_some(plan, syncer)  # versions [2, 1]
    out = syncer.on_join(5.0, "L1", Resume((1, 0), (1, 1)), incarnation="x")
    msg = sends(out)[0].message
    assert isinstance(msg, Resumed)  # keeps its progress, gets what it lacks, in full
    assert [(u.fragment, u.version, u.kind) for u in msg.updates] == [(0, 2, "full")]
    joined = [e for e in out if isinstance(e, Event) and e.kind == "joined"][0]
    assert joined.data.heal is False and joined.data.incarnation == "x"
    for bad in (Resume((99, 0), (1, 1)), Resume((1,), (1,)), Resume((1, 0), (1, 1), False, False)):
        assert isinstance(sends(syncer.on_join(6.0, "L1", bad))[0].message, Heal)


def test_learner_of_an_earlier_epoch_reveals_lost_committed_rounds():
    plan, syncer, _ = setup()
    syncer.loaded()  # a restarted syncer at versions [0, 0]
    out = syncer.on_join(1.0, "L0", Resume((0, 0), (3, 0), other_epoch=True))
    check = [e for e in out if isinstance(e, Event) and e.kind == "seen_check"][0]
    assert check.data.lost_committed_rounds == 3
    out = syncer.on_join(1.0, "L1", Resume((0, 0), (3, 0), other_epoch=True))
    checks = [e for e in out if isinstance(e, Event) and e.kind == "seen_check"]
    assert checks[0].data.lost_committed_rounds == 0


def test_a_report_of_many_steps_counts_each_step_once_up_to_a_cap():
    plan, syncer, _ = setup(schedule="pull")
    syncer.on_progress(0.0, Progress("L0", 1, 2.0, 0.0, 2.0))  # first report: its step time
    assert syncer.grace.step.value == 2.0
    syncer.on_progress(1.0, Progress("L0", 5, 9.0, 1.0, 2.0 + 4 * 0.5))  # 4 steps of 0.5 s
    expect = 2.0
    for _ in range(4):
        expect = 0.9 * expect + 0.1 * 0.5
    assert syncer.grace.step.value == pytest.approx(expect)
    assert syncer.on_progress(2.0, Progress("L0", 5, 1.0, 2.0, 99.0)) == []  # nothing new
    syncer.on_progress(3.0, Progress("L0", 5 + 1000, 1.0, 3.0, 4.0 + 1000 * 3.0))
    for _ in range(PROGRESS_STEPS_MAX):  # 1000 steps of 3 s: counted PROGRESS_STEPS_MAX times
        expect = 0.9 * expect + 0.1 * 3.0
    assert syncer.grace.step.value == pytest.approx(expect)


def test_no_pull_clock_for_a_learner_that_cannot_hear_pulls():
    plan, syncer, _ = setup(schedule="pull")
    syncer.on_join(0.0, "L2", listening=False)
    assert syncer.on_progress(0.1, Progress("L2", 1, 1.0, 0.1, 1.0)) == []
    syncer.on_listening(0.2, "L2", True)
    assert syncer.on_progress(0.3, Progress("L2", 1, 1.0, 0.3, 1.0))  # starts the clock


def test_coalescing_keeps_the_newest_and_falls_back_to_full_for_deltas():
    plan, syncer, _ = setup(down_codec="int4")
    _merge_some(plan, syncer, 3)
    ups = [o.message for o in sends(syncer.on_contribution(9.0, _contrib(plan, "L0", 0, 9, 2)))]
    new = ups[0]
    assert new.kind == "delta"
    old = FragmentUpdate(0, 2, "delta", 1, b"x", (("L1", 4),), 0.0)
    (merged,) = syncer.coalesce((old,), new)  # does not chain (version 2, new based on 3)
    assert merged.kind == "full" and merged.version == new.version
    assert torch.equal(codec.decode(merged.payload), syncer.public[0])
    assert merged.included == (("L1", 4), ("L0", 9))


def test_queued_deltas_that_chain_stay_deltas_until_they_outweigh_a_full_frame():
    plan, syncer, _ = setup(down_codec="int4")
    ups = []
    for k in range(12):
        out = syncer.on_contribution(9.0 + k, _contrib(plan, "L0", 0, 9 + k, syncer.version[0]))
        ups += [o.message for o in sends(out)]
    chain = (ups[0],)
    for u in ups[1:]:
        nxt = syncer.coalesce(chain, u)
        if len(nxt) == 1:  # fell back: the newest version in full
            assert nxt[0].kind == "full" and nxt[0].version == u.version
            assert sum(len(x.payload) for x in (*chain, u)) > 4 * plan.fragments[0].numel
            break
        assert nxt == (*chain, u)  # each delta based on the one before it
        chain = nxt
    else:
        raise AssertionError("12 int4 deltas never outweighed one fp32 frame")
    value = syncer.history[0][chain[0].base_version].clone()
    for u in chain:  # applied one by one, the learner's copy is exact
        value = value + codec.decode(u.payload, plan.fragments[0].numel)
    assert torch.equal(value, syncer.history[0][chain[-1].version])


def test_close_all_merges_every_open_round():
    plan, syncer, _ = setup(quorum=2)
    syncer.on_contribution(1.0, _contrib(plan, "L0", 0, 1, 0))
    syncer.on_contribution(1.0, _contrib(plan, "L0", 1, 2, 0))
    assert syncer.rounds_closed == 0
    out = syncer.close_all(2.0)
    assert sorted(e.data.fragment for e in out if isinstance(e, Event)) == [0, 1]
    assert syncer.version == [1, 1] and syncer.close_all(3.0) == []


def test_final_flush_sends_unsent_work_and_sends_carry_their_share():
    plan, syncer, (l0, _) = setup(schedule="pull")
    for t in range(3):
        l0.on_step(float(t), 10, 1.0)
    assert l0.unsent_work() == pytest.approx(3.0)
    (first,) = l0.send_now(3.0, [0])
    assert isinstance(first.message, Outgoing) and first.message.work_s == pytest.approx(1.5)
    flush = [s.message for s in l0.final_flush(4.0)]
    assert [o.fragment for o in flush] == [1] and flush[0].work_s == pytest.approx(1.5)
    assert l0.unsent_work() == 0.0 and l0.final_flush(5.0) == []


def test_encoder_resets_after_a_heal_and_drops_older_generations():
    plan, syncer, (l0, _) = setup(codec_name="int4")
    enc = codec.ContributionEncoder("int4", 64, True)
    l0.params["a"] += 0.123
    (o1,) = [s.message for s in l0.send_now(1.0, [0])]
    assert enc.encode(o1) is not None and enc.ef.residual
    l0.on_heal(2.0, syncer.heal_message())
    (o2,) = [s.message for s in l0.send_now(3.0, [0])]
    assert o2.generation == o1.generation + 1
    assert enc.encode(o2) is not None and enc.encode(o1) is None


@pytest.mark.parametrize(
    "change,code",
    [
        ({"step_time": math.inf}, Refusal.HEADER),
        ({"sent_at": math.nan}, Refusal.HEADER),
        ({"work_s": -1.0}, Refusal.HEADER),
        ({"steps": -1}, Refusal.COUNTERS),
        ({"base_version": -1}, Refusal.HEADER),
        ({"sent_at": -5.0}, Refusal.HEADER),
        ({"learner": "stranger"}, Refusal.NOT_JOINED),
        ({"base_version": 5}, Refusal.STALE_BASE),
        ({"fragment": 9}, Refusal.FRAGMENT),
        ({"payload": codec.encode(torch.ones(4), "int8")}, Refusal.PAYLOAD),
        ({"payload": codec.encode(torch.ones(5), "fp32")}, Refusal.PAYLOAD),
        ({"payload": b"junk"}, Refusal.PAYLOAD),
    ],
)
def test_refusals_are_typed_and_leave_state_bit_identical(change, code):
    plan, syncer, _ = setup(codec="fp32")
    before = syncer.state_dict()
    c = _contrib(plan, "L0", 0, 1, 0)
    out = syncer.on_contribution(1.0, Contribution(**{**c.__dict__, **change}))
    assert [e.kind for e in out if isinstance(e, Event)] == ["refused"]
    assert out[0].data.code == code.value and out[0].data.reason
    assert out[1] == PushAnswer(False, out[0].data.reason, code.action, code.value)
    after = syncer.state_dict()
    for a, b in zip(before["fragments"], after["fragments"], strict=True):
        assert torch.equal(a["theta"], b["theta"]) and a["version"] == b["version"]
    assert syncer.pending == [{}, {}]


def test_refusal_actions():
    assert Refusal.STALE_BASE.action == "heal" and Refusal.NOT_JOINED.action == "rejoin"
    assert Refusal.PAYLOAD.action == ""


def test_syncer_state_round_trip_continues_identically():
    plan, a, _ = setup(outer="nesterov")
    _merge_some(plan, a, 5)
    _, b, _ = setup(outer="nesterov")
    b.load_state_dict(a.state_dict())
    for s in (a, b):
        s.on_join(9.0, "L0")
    for s in (a, b):
        s.on_contribution(10.0, _contrib(plan, "L0", 1, 50, s.version[1], 0.2))
    assert a.version == b.version and a.rounds_closed == b.rounds_closed
    for p in range(plan.P):
        assert torch.equal(a.theta[p], b.theta[p]) and torch.equal(a.public[p], b.public[p])
        assert list(a.history[p]) == list(b.history[p])


def test_learner_state_round_trip_continues_identically():
    plan, syncer, (l0, l1) = setup()
    for t in range(3):
        for s in encoded(l0, l0.on_step(float(t), 10, 1.0)):
            syncer.on_contribution(t + 0.1, s.message)
    l1.load_state_dict(l0.state_dict())
    l1.id = l0.id
    for name in l0.params:
        l1.params[name].copy_(l0.params[name])
    a = [s.message for s in l0.on_step(5.0, 10, 1.0)]
    b = [s.message for s in l1.on_step(5.0, 10, 1.0)]
    assert [(o.fragment, o.seq, o.steps, o.work_s) for o in a] == [
        (o.fragment, o.seq, o.steps, o.work_s) for o in b
    ]
    assert all(torch.equal(x.delta, y.delta) for x, y in zip(a, b, strict=True))


def test_event_kinds_are_a_closed_set():
    assert {"round_closed", "accepted", "refused", "joined", "lost"} <= set(KINDS)
    with pytest.raises(KeyError, match="not one of"):
        Event.make(0.0, "made_up", "syncer")
    with pytest.raises(TypeError):
        Event.make(0.0, "lost", "syncer", learner="L0", color="red")
    e = Event.make(1.0, "lost", "syncer", learner="L0")
    assert e.to_dict() == {"t": 1.0, "kind": "lost", "source": "syncer", "data": {"learner": "L0"}}
    assert Event.from_dict(e.to_dict()) == e


def test_an_event_with_a_field_of_none_and_no_default_reads_back():
    # a learner's `step` before any pull: no latency (the live view and load_events read it)
    e = Event.make(2.0, "step", "L0", incarnation="0", step=50, tokens=800, step_time=None,
                   pulls=0, pull_latency_ms=None)  # fmt: skip
    assert e.to_dict()["data"]["pull_latency_ms"] is None
    assert "wire_up" not in e.to_dict()["data"]  # a None that is its default: left out
    assert Event.from_dict(json.loads(json.dumps(e.to_dict()))) == e


def test_step_helper_encodes():  # the tests' stand-in for a driver encodes like one
    plan, syncer, (l0, _) = setup()
    (s,) = step(l0, 1.0, 10, 1.0)
    assert isinstance(s.message, Contribution)


def test_a_newer_send_supersedes_a_queued_one_and_carries_its_work():
    from atoll.core.learner import supersede

    plan, syncer, (l0, _) = setup(schedule="pull")  # nothing is sent but what we ask for
    for t in range(2):
        l0.on_step(float(t), 10, 1.0)
    (a,) = [s.message for s in l0.send_now(2.0, [0])]
    l0.on_step(3.0, 10, 1.0)
    (b,) = [s.message for s in l0.send_now(3.0, [0])]
    c = supersede(a, b)
    assert c.seq == b.seq and torch.equal(c.delta, b.delta)
    assert c.work_s == pytest.approx(a.work_s + b.work_s) == pytest.approx(1.5)
    (other,) = [s.message for s in l0.send_now(3.0, [1])]
    with pytest.raises(ValueError, match="supersede"):
        supersede(a, other)


def test_a_model_must_match_the_plan():
    from atoll.errors import ConfigError

    plan, _, (l0, _) = setup()
    plan.check_params(l0.params)
    with pytest.raises(ConfigError, match="missing"):
        plan.check_params({"a": torch.zeros(4)})
    with pytest.raises(ConfigError, match="shape"):
        plan.check_params({"a": torch.zeros(5), "b": torch.zeros(3)})


@pytest.mark.parametrize("mode,moved", [("scale", 0.5), ("full", 1.0)])
def test_a_round_of_less_weight_than_usual_moves_theta_by_its_share(mode, moved):
    """Rounds of two learners are fragment 1's usual; a lone learner's round of the same
    work then moves Theta half as far ("scale"), where the paper's rule ("full") lets it
    replace the fragment's value. Fragment 0's history does not count for fragment 1."""
    plan, syncer, _ = setup(quorum=2, light_rounds=mode, down_codec="fp32")
    for k in range(4):
        for lid in ("L0", "L1"):
            syncer.on_contribution(1.0 + k, _contrib(plan, lid, 1, k + 1, syncer.version[1], 0.01))
    assert syncer.version[1] == 4 and syncer.round_weight.usual[1] == pytest.approx(200.0)
    assert syncer.round_weight.usual[0] is None
    before = syncer.theta[1].clone()
    syncer.on_contribution(9.0, _contrib(plan, "L0", 1, 9, syncer.version[1], 0.05))
    (closed,) = [e for e in syncer.close_all(10.0) if isinstance(e, Event)]
    assert closed.data.scale == pytest.approx(moved)
    assert torch.allclose(syncer.theta[1], before - moved * 0.05)
    usual = syncer.round_weight.usual[1]
    _, restored, _ = setup(quorum=2, light_rounds=mode, down_codec="fp32")
    restored.load_state_dict(syncer.state_dict())  # the usual weight is durable: snapshots
    assert restored.round_weight.usual == syncer.round_weight.usual
    _, replayed, _ = setup(quorum=2, light_rounds=mode, down_codec="fp32")
    replayed.load_fragment_state(syncer.fragment_state(1))  # and tape records
    assert replayed.round_weight.usual[1] == pytest.approx(usual)
    syncer.outer.lr = 1e42  # a round that is dropped (not finite) does not count
    syncer.on_contribution(11.0, _contrib(plan, "L0", 1, 10, syncer.version[1], 0.05))
    assert [e.kind for e in syncer.close_all(12.0)] == ["merge_refused"]
    assert syncer.round_weight.usual[1] == usual
    with pytest.raises(ConfigError, match="light_rounds='half'"):
        setup(light_rounds="half")


def test_what_a_rejoin_says_is_the_learner_protocols_word():
    """Both drivers build a (re)join's Hello from `rejoin_says`: nothing before the first
    heal (a fresh learner heals), else its base and newest versions, keeping its progress
    unless it asks for a heal; an earlier syncer process is said when the driver knows it."""
    plan, syncer, (l0, _) = setup()
    params = {k: torch.zeros(s) for k, s in SHAPES.items()}
    fresh = LearnerProtocol("L9", plan, params, LearnerConfig(tau=1))
    assert fresh.rejoin_says() is None and fresh.rejoin_says(heal=True) is None
    _merge_some(plan, syncer)
    for u in [o.message for o in syncer.close_all(1.0) if isinstance(o, Send)]:
        l0.on_update(1.0, u)
    says = l0.rejoin_says()
    assert says == Resume(tuple(l0.base_version), tuple(l0.latest_version))
    assert says.keep_progress and not says.other_epoch
    assert l0.rejoin_says(heal=True) == says.healing() and not says.healing().keep_progress
    assert l0.rejoin_says(other_epoch=True).other_epoch


def test_a_contribution_that_does_not_encode_is_not_sent_and_the_learner_heals():
    plan, syncer, (l0, _) = setup()
    out = l0.on_unsendable(2.0, 1, "payload holds non-finite values")
    (event,) = [o for o in out if isinstance(o, Event)]
    (send,) = [o for o in out if isinstance(o, Send)]
    assert event.data.reason == "not sent: payload holds non-finite values"
    assert send.to == "syncer" and send.message == HealRequest(event.data.reason, 1)
