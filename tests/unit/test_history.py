"""The syncer's bounded history (core/history.py): older public versions kept as the frames
that were broadcast, with full checkpoints, resolved exactly; the bound in versions and in
bytes (a base beyond it is refused, `stale_base`, and a resume heals); state in and out; the
memory formula (core/memory.py) against what is held."""

import pytest
import torch

from atoll.core import codec
from atoll.core.fragments import make_plan
from atoll.core.history import RECENT, History
from atoll.core.memory import frame_bytes, history_bytes_per_fragment, memory_bytes
from atoll.core.messages import (
    Action,
    Contribution,
    Heal,
    PushAnswer,
    Refusal,
    Resume,
    Resumed,
)
from atoll.core.syncer import SyncerConfig, SyncerProtocol
from atoll.errors import ConfigError

SHAPES = {"a": (300,), "b": (200,)}


def _syncer(**kw):
    plan = make_plan(SHAPES, P=2, H=2)
    init = [torch.randn(plan.fragments[p].numel) for p in range(plan.P)]
    cfg = SyncerConfig(quorum=1, grace=False, schedule="push", outer="sgd", **kw)
    syncer = SyncerProtocol(plan, init, cfg)
    syncer.on_join(0.0, "L0")
    return plan, syncer


def _contribution(plan, syncer, p, seq, base=None, scale=0.05):
    base = syncer.version[p] if base is None else base
    delta = scale * torch.randn(plan.fragments[p].numel)
    payload = codec.encode(delta, "fp32")
    return Contribution("L0", p, seq, base, payload, steps=1, tokens=10, sent_at=1.0, step_time=1.0)


def _run(plan, syncer, rounds, ref=None):
    """`rounds` merges of each fragment; the public value of every version, as it was (added
    to `ref`, one dict per fragment, when given)."""
    ref = ref or [{syncer.version[p]: syncer.public[p].clone()} for p in range(plan.P)]
    seq = 1000 * len(ref[0])  # after those of earlier calls
    for _ in range(rounds):
        for p in range(plan.P):
            seq += 1
            syncer.on_contribution(1.0 + seq, _contribution(plan, syncer, p, seq))
            ref[p][syncer.version[p]] = syncer.public[p].clone()
    return ref


def test_every_held_version_resolves_exactly_and_few_are_full():
    torch.manual_seed(0)
    plan, syncer = _syncer(history=20, history_full_every=4)
    ref = _run(plan, syncer, 50)
    h = syncer.history
    for p in range(plan.P):
        assert list(h[p]) == list(range(31, 51))  # the newest `history` versions, exactly
        for v in h[p]:
            assert torch.equal(h[p][v], ref[p][v]), (p, v)
        full = set(h.full[p])
        assert full <= {31, 32, 36, 40, 44, 48, 49, 50}  # oldest, checkpoints, RECENT newest
        assert h.full[p][50] is syncer.public[p]  # the newest is the public value itself
        bound = history_bytes_per_fragment(plan.fragments[p].numel, 20, 4, "int4")
        assert 0.8 * bound < h.fragment_bytes(p) <= bound  # zstd may shrink a frame


def test_full_every_one_holds_every_version_in_full_and_no_frames():
    torch.manual_seed(1)
    plan, syncer = _syncer(history=8, history_full_every=1)
    ref = _run(plan, syncer, 12)
    h = syncer.history
    assert set(h.full[0]) == set(range(5, 13)) and set(h.frames[0]) <= {11, 12}
    assert all(torch.equal(h[0][v], ref[0][v]) for v in h[0])


def test_a_contribution_on_an_older_base_is_taken_against_its_exact_value():
    torch.manual_seed(2)
    plan, syncer = _syncer(history=30, history_full_every=8)
    ref = _run(plan, syncer, 20)
    base = 13  # neither recent nor a checkpoint: resolved from frames
    assert base not in syncer.history.full[0]
    c = _contribution(plan, syncer, 0, 999, base=base)
    theta_before = syncer.theta[0].clone()
    syncer.on_contribution(100.0, c)
    # quorum 1: merged at once, with sgd and lr 1: theta - (theta - (base - delta)), to float32
    # rounding (the streamed merge sums in another order); a wrong base is off by ~0.1
    expected = ref[0][base] - codec.decode(c.payload)
    got, want = syncer.theta[0], theta_before - (theta_before - expected)
    assert (got - want).abs().max().item() < 1e-5, (got - want).abs().max()


def _bounded_run(full_every, bound, rounds):
    """`rounds` merges with `history_bytes` = bound: at most that many bytes held (the cached
    version aside), the newest versions, consecutive."""
    plan, syncer = _syncer(history=64, history_full_every=full_every, history_bytes=bound)
    ref = _run(plan, syncer, rounds)
    h = syncer.history
    assert h.nbytes() - (0 if h._cache is None else 4 * h._cache[2].numel()) <= bound
    for p in range(plan.P):
        held = list(h[p])
        assert 2 < len(held) < 64 and held == list(range(held[0], rounds + 1))
    return plan, syncer, ref


def test_beyond_the_byte_bound_the_oldest_go_and_a_base_there_is_refused():
    torch.manual_seed(3)
    numel = sum(t[0] for t in SHAPES.values())
    bound = 10 * 4 * numel  # ten fp32 copies in all
    plan, syncer, ref = _bounded_run(16, bound, 80)
    h = syncer.history
    for p in range(plan.P):
        assert all(torch.equal(h[p][v], ref[p][v]) for v in h[p])
    oldest = next(iter(h[0]))
    out = syncer.on_contribution(200.0, _contribution(plan, syncer, 0, 5000, base=oldest - 1))
    answer = out[-1]
    assert isinstance(answer, PushAnswer) and not answer.accepted
    assert answer.code == Refusal.STALE_BASE.value and answer.action == Action.HEAL
    ok = syncer.on_contribution(201.0, _contribution(plan, syncer, 0, 5001, base=oldest))
    assert any(isinstance(o, PushAnswer) and o.accepted for o in ok)
    # a learner resuming on an evicted base heals; on held bases it keeps its progress
    now = tuple(syncer.version)
    old = Resume((oldest - 1, now[1]), now, keep_progress=True)
    fine = Resume((next(iter(h[0])), now[1]), now, keep_progress=True)
    healed = syncer.on_join(202.0, "L1", old, incarnation="i1")
    kept = syncer.on_join(203.0, "L2", fine, incarnation="i2")
    assert isinstance(healed[0].message, Heal) and healed[-1].data.heal is True
    assert isinstance(kept[0].message, Resumed) and kept[-1].data.heal is False


def test_state_dict_round_trip_keeps_every_version_exact():
    torch.manual_seed(4)
    plan, a = _syncer(history=24, history_full_every=4)
    ref = _run(plan, a, 30)
    _, b = _syncer(history=24, history_full_every=4)
    b.load_state_dict(a.state_dict())
    for p in range(plan.P):
        assert list(b.history[p]) == list(a.history[p])
        for v in b.history[p]:
            assert torch.equal(b.history[p][v], ref[p][v])
    # the restored syncer goes on: new versions as frames, old ones age out exactly
    ref_b = _run(plan, b, 30)
    assert all(torch.equal(b.history[0][v], ref_b[0][v]) for v in b.history[0])
    assert len(b.history.full[0]) < 24


def test_newest_materializes_in_order_as_the_resolver_does():
    torch.manual_seed(5)
    plan, syncer = _syncer(history=16, history_full_every=8)
    ref = _run(plan, syncer, 20)
    got = syncer.history.newest(1, 8)
    assert list(got) == list(range(13, 21))
    assert all(torch.equal(t, ref[1][v]) for v, t in got.items())


def test_history_alone_resolves_what_was_remembered_and_refuses_the_rest():
    values = [torch.zeros(100)]
    h = History(values, keep=5, full_every=3)
    pub = values[0].clone()
    ref = {0: pub}
    for v in range(1, 10):
        frame = codec.encode(torch.randn(100), "int4")
        pub = pub + codec.decode(frame)
        h.remember(0, v, pub, frame)
        ref[v] = pub
    assert list(h[0]) == [5, 6, 7, 8, 9] and 4 not in h[0]
    assert all(torch.equal(h[0][v], ref[v]) for v in h[0])
    for v in [8, 5, 7, 6, 9, 7]:  # any order: from a full value or from the cached one
        assert torch.equal(h.value(0, v), ref[v])
    with pytest.raises(KeyError):
        h.value(0, 4)
    assert h.held(1) is None and len(h) == 1 and RECENT == 2


@pytest.mark.parametrize("scheme", ["fp32", "bf16", "int8", "int4"])
@pytest.mark.parametrize("n", [1, 63, 64, 1000, 4097])
def test_frame_bytes_is_the_uncompressed_frame(scheme, n):
    got = len(codec.encode(torch.randn(n), scheme, 64, compress=False))
    assert frame_bytes(n, scheme, 64, zstd=False) == got
    sent = len(codec.encode(torch.randn(n), scheme, 64))
    assert sent <= frame_bytes(n, scheme, 64)


def test_memory_formula_components_and_bad_settings():
    m = memory_bytes(10**9, 24, 8)
    assert m["theta_public"] == 8 * 10**9 // 24 * 24 or m["theta_public"] >= 8 * 10**9
    assert m["steady"] < m["round_peak"] < m["snapshot_peak"]
    plain = memory_bytes(10**9, 24, 8, full_every=1)
    assert plain["history"] > 4 * m["history"]  # 64 fp32 copies against frames
    assert memory_bytes(10**9, 24, 8, history_bytes=10**9)["history"] == 10**9
    with pytest.raises(ConfigError, match="history_full_every"):
        SyncerConfig(history_full_every=-1).validate()
    with pytest.raises(ConfigError, match="history_bytes"):
        SyncerConfig(history_bytes=-1).validate()
