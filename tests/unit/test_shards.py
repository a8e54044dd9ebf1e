"""A sharded syncer's core: which fragments each shard serves (balanced by bytes), what a shard
holds, heals, pulls and refuses, a learner healed shard by shard, and the guard on a shard's
run directory."""

import json

import pytest
import torch

from atoll.core.fragments import make_plan
from atoll.core.learner import LearnerConfig, LearnerProtocol
from atoll.core.messages import Heal, Pull, PullTick, Resume, Send
from atoll.core.shards import ShardSpec, assign, check_identity, identity, owned
from atoll.core.syncer import SyncerConfig, SyncerProtocol
from atoll.errors import ConfigError
from atoll.live.syncer.shard_set import _strip, claim
from tests.helpers import encoded

SHAPES = {"a": (40,), "b": (30,), "c": (20,), "d": (10,), "e": (5,)}


def _plan(P=5):
    return make_plan(SHAPES, P=P, H=5)


def _init(plan):
    params = {
        k: torch.randn(s, generator=torch.Generator().manual_seed(1)) for k, s in SHAPES.items()
    }
    return params, [plan.flatten(params, p) for p in range(plan.P)]


def _shard(plan, init, spec, **kw):
    cfg = SyncerConfig(quorum=1, grace=False, outer="sgd", outer_lr=1.0, schedule="pull",
                       heal_codec="fp32", **kw)  # fmt: skip
    return SyncerProtocol(plan, init, cfg, owned(plan, spec))


def test_fragments_are_dealt_by_bytes_every_one_once():
    numels = [40, 30, 20, 10, 5, 5]
    for S in (1, 2, 3, 6):
        shard_of = assign(numels, S)
        assert sorted(set(shard_of)) == list(range(S))  # every shard serves one at least
        loads = [sum(n for n, s in zip(numels, shard_of, strict=True) if s == i) for i in range(S)]
        assert max(loads) <= (4 / 3) * max(max(numels), sum(numels) / S) + 1e-9  # LPT bound
        assert assign(numels, S) == shard_of  # every process computes the same
    assert assign(numels, 2) == [0, 1, 1, 0, 0, 1]  # 40+10+5 against 30+20+5


@pytest.mark.parametrize("text", ["0/0", "2/2", "-1/2", "a/b", "1", "1/2/3"])
def test_a_bad_shard_names_the_value_and_the_form(text):
    with pytest.raises(ConfigError) as e:
        ShardSpec.parse(text)
    assert repr(text) in str(e.value) and "0 <= i < S" in str(e.value)


@pytest.mark.parametrize("count", [0, 6])
def test_a_shard_count_outside_1_to_P_is_refused(count):
    plan = _plan()
    with pytest.raises(ConfigError) as e:
        ShardSpec(0, count).check(plan.P)
    assert f"shards={count}" in str(e.value) and "1 to the plan's 5 fragments" in str(e.value)
    with pytest.raises(ConfigError):
        assign([f.numel for f in plan.fragments], count)


def test_a_shard_holds_heals_and_pulls_only_its_fragments():
    plan = _plan()
    _, init = _init(plan)
    mine = owned(plan, ShardSpec(1, 2))
    s = _shard(plan, init, ShardSpec(1, 2))
    assert s.served == sorted(mine) and mine
    for p in range(plan.P):  # nothing of the others is held
        assert s.theta[p].numel() == (plan.fragments[p].numel if p in mine else 0)
    heal = [o for o in s.on_join(0.0, "L0") if isinstance(o, Send)][0].message
    assert sorted(u.fragment for u in heal.updates) == sorted(mine)
    pulled = set()
    for tick in range(plan.H):
        pulled |= {o.message.fragment for o in s.on_timer(float(tick), PullTick(tick))
                   if isinstance(o, Send) and isinstance(o.message, Pull)}  # fmt: skip
    assert pulled == mine
    assert all(st["theta"].numel() == 0 for st in s.state_dict()["fragments"]
               if st["fragment"] not in mine)  # fmt: skip
    # a resume is checked against this shard's fragments only: the others' versions are not
    # its to hold (here: beyond anything it has)
    r = Resume(
        tuple(0 if p in mine else 99 for p in range(plan.P)),
        tuple(0 if p in mine else 99 for p in range(plan.P)),
        keep_progress=True,
    )
    msg = [o for o in s.on_join(1.0, "L1", r) if isinstance(o, Send)][0].message
    assert not isinstance(msg, Heal) and msg.updates == ()


def test_a_contribution_for_another_shard_is_refused_and_merges_nothing():
    plan = _plan()
    params, init = _init(plan)
    s0 = _shard(plan, init, ShardSpec(0, 2))
    s0.on_join(0.0, "L0")
    lp = LearnerProtocol("L0", plan, {k: v.clone() for k, v in params.items()},
                         LearnerConfig(codec="fp32", schedule="pull"))  # fmt: skip
    lp.on_heal(0.0, Heal(tuple(
        u for sh in (s0, _shard(plan, init, ShardSpec(1, 2)))
        for u in [o for o in sh.on_join(0.0, "L0") if isinstance(o, Send)][0].message.updates
    )))  # fmt: skip
    other = min(set(range(plan.P)) - s0.owned)
    lp.on_step(1.0, 10, 1.0)
    lp.on_pull(1.0, Pull(other, 0, 1.0))
    c = next(o.message for o in encoded(lp, lp.on_step(2.0, 10, 1.0))
             if o.message.__class__.__name__ == "Contribution")  # fmt: skip
    out = s0.on_contribution(2.1, c)
    answer = [o for o in out if o.__class__.__name__ == "PushAnswer"][0]
    assert not answer.accepted and "not served by this shard" in answer.reason
    assert s0.rounds_closed == 0 and s0.version == [0] * plan.P


def test_a_learner_trains_once_every_shard_healed_it_and_a_later_heal_keeps_the_rest():
    plan = _plan()
    params, init = _init(plan)
    shards = [_shard(plan, init, ShardSpec(i, 2)) for i in range(2)]
    heals = [[o for o in s.on_join(0.0, "L0") if isinstance(o, Send)][0].message for s in shards]
    lp = LearnerProtocol("L0", plan, {k: torch.zeros(s) for k, s in SHAPES.items()},
                         LearnerConfig(codec="fp32", schedule="pull"))  # fmt: skip
    assert lp.on_heal(0.0, heals[0]) == [] and not lp.healed
    with pytest.raises(RuntimeError):
        lp.on_step(0.5, 10, 1.0)
    assert [e.kind for e in lp.on_heal(0.0, heals[1])] == ["healed"] and lp.healed
    for name, value in params.items():
        assert torch.equal(lp.params[name], value)
    # progress on every fragment, one of each shard sent and not answered
    for t in lp.params.values():
        t.add_(1.0)
    a, b = sorted(shards[0].owned)[0], sorted(shards[1].owned)[0]
    for p in (a, b):
        lp.on_pull(1.0, Pull(p, 0, 1.0))
    lp.on_step(1.0, 10, 1.0)
    assert set(lp.outstanding) == {a, b}
    # shard 1 restarts and cannot resume: its heal resets its fragments, not shard 0's
    lp.on_heal(2.0, heals[1])
    assert set(lp.outstanding) == {a} and lp.generation == 2
    for p in shards[1].owned:
        assert torch.equal(plan.flatten(lp.params, p), init[p])
    for p in shards[0].owned:
        assert torch.equal(plan.flatten(lp.params, p), init[p] + 1.0)
    # a restarted shard that resumes it asks again for its own unanswered fragments only
    lp.on_pull(2.5, Pull(b, 1, 2.5))
    lp.on_step(3.0, 10, 1.0)
    assert set(lp.outstanding) == {a, b}
    lp.on_welcome(3.5, restarted=True, heal=False, served=sorted(shards[0].owned))
    assert lp.pulled == {a}


def test_a_shard_directory_is_claimed_once_and_refuses_another_shard(tmp_path):
    plan = _plan()
    ident0 = identity(plan, ShardSpec(0, 2), "run-a")
    claim(tmp_path / "s0", ident0)
    assert json.loads((tmp_path / "s0" / "shard.json").read_text()) == ident0
    claim(tmp_path / "s0", ident0)  # the same shard again: a restart
    for other in (identity(plan, ShardSpec(1, 2), "run-a"), identity(plan, ShardSpec(0, 2), "b")):
        with pytest.raises(ConfigError) as e:
            claim(tmp_path / "s0", other)
        assert "shard 0/2 of run 'run-a'" in str(e.value) and "its own directory" in str(e.value)
    # a directory holding a syncer's state without saying whose (a copied tape, an unsharded run)
    (tmp_path / "s1" / "tape").mkdir(parents=True)
    (tmp_path / "s1" / "tape" / "00000000.tape").write_bytes(b"x")
    with pytest.raises(ConfigError) as e:
        claim(tmp_path / "s1", identity(plan, ShardSpec(1, 2), "run-a"))
    assert "no shard.json" in str(e.value)
    with pytest.raises(ConfigError):
        check_identity({"garbage": 1}, ident0, "here")


def test_each_shard_is_started_with_its_own_flags():
    argv = [
        "syncer",
        "--shards",
        "2",
        "--run-dir",
        "d",
        "--set",
        "x=1",
        "--events=e",
        "--no-budget",
        "--http-port",
        "8080",  # the set's: each shard is given its own
        "--http-host",
        "0.0.0.0",
    ]
    assert _strip(argv) == ["syncer", "--set", "x=1", "--no-budget", "--http-host", "0.0.0.0"]


def test_a_shard_refuses_to_restore_another_shards_tape_or_snapshot(tmp_path):
    from atoll.live.syncer.store import Tape, commit_record, restore, write_snapshot
    from atoll.live.syncer.store_read import StoreError

    plan = _plan()
    params, init = _init(plan)
    s1 = _shard(plan, init, ShardSpec(1, 2))
    s1.on_join(0.0, "L0")
    p = sorted(s1.owned)[0]
    tape = Tape(tmp_path / "tape")
    tape.open_segment(0)
    tape.append(commit_record(s1, tape.next_seq, p, {}))
    tape.close()
    write_snapshot(tmp_path / "snap.safetensors", s1.state_dict(), 1, {})
    s0 = _shard(plan, init, ShardSpec(0, 2))
    cases = ((tmp_path / "none", Tape(tmp_path / "tape")), (tmp_path / "snap.safetensors", None))
    for snap, t in cases:
        t = t or Tape(tmp_path / "empty")
        with pytest.raises(StoreError) as e:
            restore(s0, snap, t)
        assert "another shard" in str(e.value), e.value
    assert s0.version == [0] * plan.P  # nothing was loaded
