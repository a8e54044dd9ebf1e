"""The frames-only history (`history_full_every = 0`, core/history.py): no full value but the
newest, older versions resolved backward from it by subtracting the broadcast frames, to
float32 rounding (checked against the exact values with a tolerance of a few ulps per version
between); the bounds in versions and bytes, a restore, a tape replay, and the memory formula
(core/memory.py) against what is held."""

import gc
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from atoll.core import codec
from atoll.core.fragments import make_plan
from atoll.core.history import History
from atoll.core.memory import frame_bytes, history_bytes_per_fragment, memory_bytes
from atoll.core.messages import Contribution, PushAnswer, Refusal
from atoll.core.syncer import SyncerConfig, SyncerProtocol
from atoll.errors import ConfigError
from tests.unit.test_history import _bounded_run, _contribution, _run, _syncer

EPS = torch.finfo(torch.float32).eps


def _close(got: torch.Tensor, want: torch.Tensor, versions: int) -> None:
    """Within float32 rounding: one ulp of the largest magnitude per subtraction, twice."""
    scale = max(want.abs().max().item(), 1.0)
    err = (got - want).abs().max().item()
    assert err <= 2 * versions * EPS * scale, (err, versions)


def _all_close(h: History, ref: list[dict], newest: int) -> None:
    """Every held version of every fragment, to float32 rounding of its exact value."""
    for p in range(len(h)):
        for v in h[p]:
            _close(h[p][v], ref[p][v], newest - v)


def test_every_held_version_resolves_to_float32_rounding_and_only_frames_are_held():
    torch.manual_seed(0)
    plan, syncer = _syncer(history=20, history_full_every=0)
    ref = _run(plan, syncer, 50)
    h = syncer.history
    _all_close(h, ref, 50)
    for p in range(plan.P):
        assert list(h[p]) == list(range(31, 51))
        assert set(h.full[p]) == {50} and h.full[p][50] is syncer.public[p]
        assert set(h.frames[p]) == set(range(32, 51))  # the oldest's frame is not needed
        n = plan.fragments[p].numel
        bound = history_bytes_per_fragment(n, 20, 0, "int4")
        assert bound == 19 * frame_bytes(n, "int4")
        held = sum(len(f) for f in h.frames[p].values())  # nothing in full is counted
        assert h.fragment_bytes(p) == held <= bound  # zstd may shrink a frame
        assert held > 0.8 * 19 * frame_bytes(n, "int4", zstd=False)
    # the rounding is far below an int4 step of a broadcast delta (absmax / 7)
    q = codec.decode(h.frames[0][50]).abs().max().item() / 7
    assert (h[0][31] - ref[0][31]).abs().max().item() < q / 100


@settings(max_examples=25, deadline=None)
@given(
    keep=st.integers(2, 12),
    versions=st.integers(1, 30),
    queries=st.lists(st.integers(0, 40), max_size=12),
    seed=st.integers(0, 2**16),
)
def test_backward_resolution_matches_the_exact_forward_one(keep, versions, queries, seed):
    gen = torch.Generator().manual_seed(seed)
    start = torch.randn(257, generator=gen) * 3
    exact = History([start], keep=keep, full_every=4)  # forward: bit for bit
    frames = History([start], keep=keep, full_every=0)
    pub, ref = start, {0: start}
    for v in range(1, versions + 1):
        frame = codec.encode(0.1 * torch.randn(257, generator=gen), "int4")
        pub = pub + codec.decode(frame)
        ref[v] = pub
        exact.remember(0, v, pub, frame)
        frames.remember(0, v, pub, frame)
    assert (
        list(frames[0]) == list(exact[0]) == list(range(max(0, versions - keep + 1), versions + 1))
    )
    for q in queries:  # any order, through the cache or not
        if q not in exact[0]:
            with pytest.raises(KeyError):
                frames.value(0, q)
            continue
        assert torch.equal(exact.value(0, q), ref[q])
        _close(frames.value(0, q), ref[q], versions - q)
    newest = frames.newest(0, keep)
    assert list(newest) == list(frames[0])
    assert all(torch.equal(t, frames.value(0, v)) for v, t in newest.items())  # same ops
    assert set(frames.full[0]) == {versions}


def test_the_byte_bound_drops_the_oldest_and_a_base_there_is_refused():
    torch.manual_seed(3)
    bound = 6 * frame_bytes(300, "int4") + 6 * frame_bytes(200, "int4")
    plan, syncer, ref = _bounded_run(0, bound, 40)
    h = syncer.history
    for p in range(plan.P):
        n = plan.fragments[p].numel  # as many as fit its share (by size), not one more
        share = bound * n / 500
        assert h.fragment_bytes(p) <= share < h.fragment_bytes(p) + frame_bytes(n, "int4")
        assert len(h.full[p]) == 1
    _all_close(h, ref, 40)
    oldest = next(iter(h[0]))
    out = syncer.on_contribution(200.0, _contribution(plan, syncer, 0, 5000, base=oldest - 1))
    assert isinstance(out[-1], PushAnswer) and out[-1].code == Refusal.STALE_BASE.value
    ok = syncer.on_contribution(201.0, _contribution(plan, syncer, 0, 5001, base=oldest))
    assert any(isinstance(o, PushAnswer) and o.accepted for o in ok)


def test_a_restored_history_is_full_until_it_ages_out_then_frames_only():
    torch.manual_seed(4)
    plan, a = _syncer(history=12, history_full_every=0)
    ref = _run(plan, a, 20)
    _, b = _syncer(history=12, history_full_every=0)
    snap = a.state_dict(keep_history=8)  # a snapshot of 8 versions, in full
    held = a.history.full[0]
    made = [v for v, t in snap["fragments"][0]["history"].items() if t is not held.get(v)]
    assert made == list(range(13, 20))  # the memory formula's snapshot_history - 1 copies
    b.load_state_dict(snap)
    h = b.history
    assert list(h[0]) == list(range(13, 21)) and set(h.full[0]) == set(range(13, 21))
    for v in h[0]:  # written as resolved: to rounding of the exact value
        _close(h[0][v], ref[0][v], 20 - v)
    ref_b = _run(plan, b, 3, [{v: h[p][v].clone() for v in h[p]} for p in range(plan.P)])
    # 13..19 restored (no frames between): still full; 20 reached by the frame of 21
    assert set(h.full[0]) == set(range(13, 20)) | {23}
    assert all(torch.equal(h[0][v], ref_b[0][v]) for v in range(13, 20))
    for v in (20, 21, 22):
        _close(h[0][v], ref_b[0][v], 23 - v)
    _run(plan, b, 12, ref_b)  # the restored ones aged out: frames only again
    assert set(h.full[0]) == {35} and len(h[0]) == 12
    assert all(torch.equal(h.value(0, v), h[0][v]) for v in h[0])


def test_a_held_version_loaded_again_keeps_the_older_ones_resolvable():
    """A tape record replays a fragment's current version in full: its frame goes, so the
    version below it is made full first (and the older ones are reached from that one)."""
    torch.manual_seed(5)
    plan, syncer = _syncer(history=8, history_full_every=0)
    ref = _run(plan, syncer, 10)
    h = syncer.history
    before = {v: h[0][v].clone() for v in h[0]}
    syncer.load_fragment_state(syncer.fragment_state(0))  # version 10 again, in full
    assert list(h[0]) == list(range(3, 11))
    assert set(h.full[0]) == {9, 10} and 10 not in h.frames[0]
    assert all(torch.equal(h[0][v], before[v]) for v in h[0])
    assert torch.equal(h[0][10], ref[0][10])
    _run(plan, syncer, 8)
    assert len(h.full[0]) == 1 and set(h.frames[0]) == set(range(12, 19))


def test_memory_formula_frames_only_and_settings():
    N, P, M = 10**9, 24, 8
    n = -(-N // P)  # ceil
    d, f = memory_bytes(N, P, M), memory_bytes(N, P, M, full_every=0)
    assert f["history"] == P * 63 * frame_bytes(n, "int4") < d["history"]
    # a snapshot writes the protocol's tensors, and resolves every version it writes but the
    # newest from frames (RECENT = 2 held in full otherwise)
    assert f["snapshot_peak"] - f["steady"] == 4 * n * P * (8 - 1)
    assert d["snapshot_peak"] - d["steady"] == 4 * n * P * (8 - 2)
    small = memory_bytes(N, P, M, full_every=0, history=4, heal_codec="int4")
    assert small["steady"] / N <= 12  # BENCHMARKS.md section 11
    assert memory_bytes(N, P, M, full_every=0, history=4)["steady"] / N > 12
    SyncerConfig(history_full_every=0).validate()
    with pytest.raises(ConfigError, match="history_full_every"):
        SyncerConfig(history_full_every=-1).validate()


def _held_tensors(root: object) -> dict[int, int]:
    """The tensor storages reachable from `root` by strong references: address -> bytes."""
    seen, out, todo = set(), {}, [root]
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            out[st.data_ptr()] = st.nbytes()
        else:
            todo.extend(gc.get_referents(o))
    return out


def test_what_the_syncer_holds_in_tensors_is_the_formulas():
    """Frames only, after a heal and rounds: the exact and public values, and one decode
    buffer per live learner (the formula's open round: kept between rounds for the next, of
    any fragment); no public value the protocol replaced is kept (the heal cache's)."""
    P, n, M = 6, 640, 3
    plan = make_plan({f"w{p}": (n,) for p in range(P)}, P=P, H=P)
    cfg = SyncerConfig(quorum=M, grace=False, schedule="push", outer="sgd", history_full_every=0)
    syncer = SyncerProtocol(plan, [torch.randn(n) for _ in range(P)], cfg)
    payloads = [codec.encode(0.01 * torch.randn(n), "int4") for _ in range(M)]
    for m in range(M):
        syncer.on_join(0.0, f"L{m}")  # a heal: every fragment encoded in full, cached
    seq = 0
    for _ in range(3):
        for p in range(P):
            for m in range(M):
                seq += 1
                c = Contribution(
                    f"L{m}", p, seq, syncer.version[p], payloads[m], steps=1, tokens=10,
                    sent_at=1.0, step_time=1.0,
                )  # fmt: skip
                syncer.on_contribution(float(seq), c)
    assert syncer.version == [3] * P and syncer.history._cache is None
    held = _held_tensors(syncer)
    assert sorted(held.values()) == [4 * n] * (2 * P + M)
    m = memory_bytes(P * n, P, M, full_every=0)
    assert M * 4 * n <= m["open_rounds"] and 2 * P * 4 * n == m["theta_public"]
