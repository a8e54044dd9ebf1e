"""The fused round (core/fused.py, numba) against the torch reference path: the same values
(float32 steps bit for bit; what passes through a float64 norm within its rounding), the same
frame bytes for the same input, the same refusals with nothing changed, and the same result on
1 and 2 threads."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from atoll.core import codec, fused, intake, merge
from atoll.core.fragments import make_plan
from atoll.core.messages import Contribution
from atoll.core.syncer import SyncerProtocol
from atoll.core.syncer_config import SyncerConfig
from atoll.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def k():
    fused.configure("on", "1")
    kernels = fused.kernels(1)
    assert kernels is not None, "numba kernels did not load"
    yield kernels
    fused.configure("auto", "auto")


sizes_st = st.lists(st.integers(1, 300), min_size=1, max_size=4)
groups = st.sampled_from([64, 7, 1])


def _vec(n: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(n, generator=torch.Generator().manual_seed(seed))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2000), scheme=st.sampled_from(["int4", "int8", "bf16"]), group=groups,
       seed=st.integers(0, 99))  # fmt: skip
def test_a_held_contribution_is_the_references_decode(k, n, scheme, group, seed):
    """A frame held as its body: the values it stands for are the reference's bit for bit,
    its norm (from the frame alone) within float64 rounding, and it is found finite."""
    base = _vec(n, seed)
    frame = codec.encode(_vec(n, seed + 1, 0.01), scheme, group)
    want, want_norm, unchecked = intake.decode_from(frame, base)
    held, norm, finite = intake.decode_from(frame, base, hold=k)
    assert isinstance(held, fused.Held) and unchecked is None and finite is True
    assert torch.equal(held.values(), want)
    assert norm == pytest.approx(want_norm, rel=1e-12)


def test_a_held_contribution_whose_base_minus_delta_overflows_is_found_so():
    """The finiteness bound (largest |base| + largest |value|) fails here: the exact check
    decides, as the reference's does."""
    k = fused.kernels(1)
    base = torch.zeros(256)
    base[3] = 3.3e38
    delta = torch.zeros(256)
    delta[3], delta[200] = -1e38, 1e38  # base - delta overflows at 3 only
    frame = codec.encode(delta, "int8", 64)
    _held, _norm, finite = intake.decode_from(frame, base, hold=k)
    assert finite is False
    delta[3] = 1e38  # the bound fails (3.3e38 + 1e38), the values do not overflow
    _held, _norm, finite = intake.decode_from(codec.encode(delta, "int8", 64), base, hold=k)
    assert finite is True


def _held(k, theta, deltas, scheme="int4", group=64):
    """Contributions theta_m = theta - deltas[m], held, and their values."""
    held = [intake.decode_from(codec.encode(d, scheme, group), theta, hold=k)[0] for d in deltas]
    return held, [h.values() for h in held]


def _merge_both(k, theta, held, values, weights, sizes, mean):
    want = merge.merge_flat(theta, values, weights, sizes, mean)
    w = merge.normalized(values, weights)
    out, tscale = fused.merge(k, theta, held, w, sizes, mean, merge.CANCELLED)
    start = 0
    for size, s in zip(sizes, tscale, strict=True):
        seg = out[start : start + size]
        seg.zero_() if s == 0.0 else seg.mul_(s)
        start += size
    return out, want


@settings(max_examples=40, deadline=None)
@given(sizes=sizes_st, m=st.integers(1, 5), mean=st.booleans(), seed=st.integers(0, 99),
       zero=st.booleans(), cancel=st.booleans(), scheme=st.sampled_from(["int4", "int8", "bf16"]),
       group=groups)  # fmt: skip
def test_a_merge_is_the_references_within_float_rounding(
    k, sizes, m, mean, seed, zero, cancel, scheme, group
):
    """RDA and mean over held contributions of every codec and group size (tensors that do
    not start on a group); zero outer gradients (a contribution equal to theta) and
    cancelling ones (two opposite contributions of equal weight)."""
    n = sum(sizes)
    theta = _vec(n, seed)
    deltas = [_vec(n, seed + 1 + i, 0.01) for i in range(m)]
    weights = [1.0 + i for i in range(m)]
    if zero:
        deltas[0] = torch.zeros(n)
    if cancel:
        d = _vec(n, seed + 50, 0.01)
        deltas, weights = [d, -d], [1.0, 1.0]
    held, values = _held(k, theta, deltas, scheme, group)
    got, want = _merge_both(k, theta, held, values, weights, sizes, mean)
    # cancelling contributions leave a merge far smaller than its terms: its float rounding is
    # then relative to the terms (here 0.01 a value), not to what is left
    atol = 2e-6 * max(float(d.abs().max()) for d in deltas) if cancel else 1e-9
    torch.testing.assert_close(got, want, rtol=2e-6, atol=atol)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), scheme=st.sampled_from(["int4", "int8"]), group=groups,
       kind=st.sampled_from(["sgd", "nesterov"]), light=st.sampled_from([1.0, 0.37]),
       seed=st.integers(0, 99))  # fmt: skip
def test_the_close_gives_the_references_values_and_frame_bytes(
    k, n, scheme, group, kind, light, seed
):
    """For the same merged delta: the outer step's new value, the new public value and the
    broadcast frame are the reference's, byte for byte."""
    from atoll.core.outer import OuterOptimizer, OuterState

    theta, public = _vec(n, seed), _vec(n, seed) + _vec(n, seed + 1, 1e-3)
    delta = _vec(n, seed + 2, 0.01)
    buf = _vec(n, seed + 3, 0.01) if kind == "nesterov" else None
    outer = OuterOptimizer(kind, 0.7, 0.9)
    ref_delta = delta * light if light != 1.0 else delta
    state = OuterState(buf=None if buf is None else buf.clone())
    want_theta = outer.step(theta, ref_delta, state)
    want_frame, sent = codec.encode_sent(want_theta - public, scheme, group)
    ok, top, new, new_buf, new_public, _sf, body = fused.step_encode(
        k, theta, delta, [1.0], [n], light, kind, 0.7, 0.9, buf, public, scheme, group,
        codec.QMAX[scheme],
    )  # fmt: skip
    assert ok
    assert torch.equal(new, want_theta)
    assert torch.equal(new_public, public + sent)
    assert codec.framed(scheme, n, max(1, min(group, n)), body) == want_frame
    if kind == "nesterov":
        assert torch.equal(new_buf, state.buf)


def test_a_bf16_payload_that_is_not_finite_is_refused_as_by_the_reference(k):
    body = bytearray(torch.ones(300).to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    body[20:22] = b"\xc0\x7f"  # a NaN, in a well-formed frame (its checksum its own)
    frame = codec.framed("bf16", 300, 1, bytes(body), compress=False)
    for hold in (None, k):
        with pytest.raises(codec.CodecError, match="payload holds non-finite values"):
            intake.decode_from(frame, torch.zeros(300), hold=hold)


def test_a_buffer_held_elsewhere_is_never_written_by_a_later_close(k):
    """A round's old values go to a pool for later closes: one still referenced, or with a
    view of its memory alive, is not taken; once let go, it is."""
    n = fused.MIN_VALUES + 7
    t = torch.ones(n)
    view = t[1:]
    fused.give(t)
    del t
    assert fused._take(n).data_ptr() != view.data_ptr() - 4
    ptr = view.data_ptr() - 4
    del view
    assert fused._take(n).data_ptr() == ptr
    other = torch.ones(n)
    fused.give(other)
    assert fused._take(n).data_ptr() != other.data_ptr()


def test_a_merge_that_is_not_finite_is_refused_and_nothing_changes(k):
    theta, public = _vec(300, 0), _vec(300, 0)
    delta = _vec(300, 1)
    delta[5] = float("inf")
    ok, *_ = fused.step_encode(k, theta, delta, [1.0], [300], 1.0, "sgd", 1.0, 0.9, None,
                               public, "int4", 64, 7)  # fmt: skip
    assert not ok
    huge = torch.full((300,), 3e38)
    ok, top, *_ = fused.step_encode(k, -huge, huge, [1.0], [300], 1.0, "sgd", 1.0, 0.9, None,
                                    torch.zeros(300), "int4", 64, 7)  # fmt: skip
    assert ok is False or top > 3e38  # -3e38 - 3e38 overflows: refused either way
    with pytest.raises(codec.CodecError):
        codec.check_encodable(top if ok else float("inf"))


def _round(fused_mode: str, outer: str = "sgd", rounds: int = 3, seed: int = 0):
    """A syncer of two fragments (one an embedding), 3 learners, `rounds` rounds."""
    fused.configure(fused_mode, "1")
    shapes = {"emb.weight": (50, 8), "a": (301,), "b": (17, 9)}
    plan = make_plan(shapes, P=2, H=2, embeddings={"emb.weight"})
    init = [_vec(f.numel, seed + p) for p, f in enumerate(plan.fragments)]
    cfg = SyncerConfig(quorum=3, grace=False, schedule="push", outer=outer, fused=fused_mode)
    syncer = SyncerProtocol(plan, [t.clone() for t in init], cfg)
    for i in range(3):
        syncer.on_join(0.0, f"L{i}")
    for r in range(rounds):
        for p, f in enumerate(plan.fragments):
            v = syncer.version[p]
            for i in range(3):
                delta = _vec(f.numel, 1000 * r + 10 * p + i, 0.01 * (i + 1))
                frame = codec.encode(delta, "int4")
                c = Contribution(f"L{i}", p, r * 3 + i, v, frame, 4, 4096 * (i + 1), 1.0, 0.1, 0.4)
                syncer.on_contribution(1.0 + r, c)
    fused.configure("auto", "auto")
    return syncer


@pytest.mark.parametrize("outer", ["sgd", "nesterov"])
def test_a_syncers_rounds_are_the_references_within_float_rounding(k, outer):
    ref, got = _round("off", outer), _round("on", outer)
    assert ref.version == got.version == [3, 3]
    for p in range(2):
        torch.testing.assert_close(got.theta[p], ref.theta[p], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.public[p], ref.public[p], rtol=1e-5, atol=1e-3)


def test_one_and_two_threads_give_the_same_bits(k):
    a = _round("on", "nesterov")
    fused.configure("on", str(min(2, fused.cores())))
    b = _round("on", "nesterov")
    for p in range(2):
        assert torch.equal(a.theta[p], b.theta[p]) and torch.equal(a.public[p], b.public[p])


def test_bad_settings_stop_in_one_line_naming_the_value():
    with pytest.raises(ConfigError, match="fused='fast' is not allowed: one of auto, on, off"):
        fused.check("fast", "auto")
    for bad in ("0", "999", "two"):
        with pytest.raises(ConfigError, match=rf"syncer_threads='{bad}' is not allowed: auto "
                           r"or an integer in \[1, \d+\]"):  # fmt: skip
            SyncerConfig(syncer_threads=bad).validate()
    assert fused.check("auto", "auto") == fused.cores()


def test_kernels_that_cannot_load_fall_back_to_the_reference_with_one_log_line(monkeypatch, caplog):
    """A kernel that cannot be compiled or loaded here (no numba, a broken cache): one line
    on the syncer's log, and rounds go on by the torch path with the same results."""
    import sys

    monkeypatch.setattr(fused, "_loaded", {})
    monkeypatch.setitem(sys.modules, "atoll.core.fused_kernels", None)  # its import fails
    with caplog.at_level("WARNING", logger="atoll.syncer"):
        got = _round("on")
    lines = [r.getMessage() for r in caplog.records if "fused kernels" in r.getMessage()]
    assert len(lines) == 1 and "rounds take the torch path" in lines[0], lines
    monkeypatch.setattr(fused, "_loaded", {})
    ref = _round("off")
    for p in range(2):
        assert torch.equal(got.theta[p], ref.theta[p]) and torch.equal(got.public[p], ref.public[p])


def test_a_contribution_whose_base_minus_delta_overflows_is_refused_as_before(k):
    """A base near the float32 maximum: base - delta overflows; the kernel's finite check
    refuses it as the reference path's does (nothing pending)."""
    fused.configure("on", "1")
    plan = make_plan({"a": (300,)}, P=1, H=1)
    cfg = SyncerConfig(quorum=2, grace=False, schedule="push", guard=0)
    syncer = SyncerProtocol(plan, [torch.full((300,), -3.3e38)], cfg)
    syncer.on_join(0.0, "L0")
    syncer.on_join(0.0, "L1")
    frame = codec.encode(torch.full((300,), 1e38), "int4")
    out = syncer.on_contribution(1.0, Contribution("L0", 0, 1, 0, frame, 4, 4096, 1.0, 0.1, 0.4))
    assert "overflows float32" in str(out[0].data), out
    assert syncer.pending[0] == {}
    fused.configure("auto", "auto")


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_contribution_prepared_off_the_lock_is_taken_as_one_that_was_not(k, mode):
    """SyncerProtocol.prepare (crc, decompression, the frame's measure, on a driver's
    receiving thread): the same answers, refusals and round as without it."""
    fused.configure(mode, "1")
    plan = make_plan({"a": (700,), "b": (300,)}, P=2, H=2)

    def run(prepare: bool):
        syncer = SyncerProtocol(plan, [_vec(700, 1), _vec(300, 2)], SyncerConfig(
            quorum=2, grace=False, schedule="push", fused=mode))  # fmt: skip
        for lid in ("L0", "L1"):
            syncer.on_join(0.0, lid)
        good = codec.encode(_vec(700, 3, 0.01), "int4")
        bad = good[:-1] + bytes([good[-1] ^ 1])  # its checksum fails
        cs = [Contribution("L0", 0, 1, 0, bad, 4, 4096, 1.0, 0.1, 0.4),
              Contribution("L0", 0, 2, 0, good, 4, 4096, 1.0, 0.1, 0.4),
              Contribution("L1", 5, 1, 0, good, 4, 4096, 1.0, 0.1, 0.4),
              Contribution("L1", 0, 3, 0, codec.encode(_vec(700, 4, 0.01), "int4"), 4, 8192,
                           1.0, 0.1, 0.4)]  # fmt: skip
        events = []
        for c in cs:
            out = syncer.on_contribution(1.0, syncer.prepare(c) if prepare else c)
            events.append([repr(getattr(o, "data", o)) for o in out])
        return syncer, events

    (a, ea), (b, eb) = run(False), run(True)
    assert ea == eb and "checksum" in ea[0][0] and any("RoundClosed" in e for e in ea[3])
    assert torch.equal(a.theta[0], b.theta[0]) and torch.equal(a.public[0], b.public[0])
    fused.configure("auto", "auto")
