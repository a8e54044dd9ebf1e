"""The streamed merge (`merge_flat`, what the syncer runs) equals the reference
`merge_fragment` (per-tensor outer gradients materialized, float64) within float rounding."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from atoll.core.merge import merge_flat, merge_fragment


def test_one_lightly_weighted_outer_gradient_beside_zero_ones_is_not_a_cancellation():
    theta = torch.tensor([3.0, -2.0])
    values = [theta.clone(), theta - torch.tensor([50.0, 20.0])]  # the first: outer gradient 0
    w = [1.0, 4.688549373364356e-22]  # a hypothesis find: normalized, the second is ~5e-22
    ref = torch.cat(merge_fragment([[theta - v] for v in values], w, False, "rda"))
    got = merge_flat(theta, values, w, [2], False)
    assert float(ref.abs().max()) > 0
    torch.testing.assert_close(got, ref, rtol=2e-6, atol=0.0)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=4),
    m=st.integers(1, 6),
    weights=st.lists(st.floats(0, 100), min_size=6, max_size=6),
    method=st.sampled_from(["rda", "mean"]),
    embedding=st.booleans(),
    zero=st.integers(-1, 5),
    seed=st.integers(0, 2**16),
    chunk=st.sampled_from([7, 64, 1 << 16]),  # chunks that split tensors, and not
)
def test_streamed_merge_equals_the_reference(
    sizes, m, weights, method, embedding, zero, seed, chunk
):
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    theta = torch.randn(n, generator=g)
    scales = torch.logspace(-6, 2, m)
    values = [theta - scales[i] * torch.randn(n, generator=g) for i in range(m)]
    if 0 <= zero < m:
        values[zero] = theta.clone()  # an outer gradient of 0 (RDA: norm 0)
    w = weights[:m]
    deltas = [list((theta - v).split(sizes)) for v in values]
    ref = torch.cat(merge_fragment(deltas, w, embedding, method))
    got = merge_flat(theta, values, w, sizes, embedding or method == "mean", chunk)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=2e-6, atol=1e-6 * float(ref.abs().max()) + 1e-30)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 200),
    bad=st.sampled_from([None, float("nan"), float("inf"), -float("inf"), 3e38]),
    at=st.integers(0, 199),
)
def test_all_finite_agrees_with_isfinite(n, bad, at):
    from atoll.core.codec import all_finite

    x = torch.randn(n) * 1e37
    if bad is not None and n:
        x[at % n] = bad
        x[(at + 1) % n] = bad if bad != bad else abs(bad)  # overflowing sums of finite values
    assert all_finite(x) == bool(torch.isfinite(x).all())


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 3000),
    group=st.sampled_from([1, 3, 64, 128]),
    scheme=st.sampled_from(["int4", "int8", "bf16", "fp32"]),
    compress=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_decode_from_equals_base_minus_decode(n, group, scheme, compress, seed):
    from atoll.core import codec, intake

    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, generator=g)
    frame = codec.encode(0.01 * torch.randn(n, generator=g), scheme, group, compress)
    delta = codec.decode(frame, n)
    theta, norm, _ = intake.decode_from(frame, base)
    assert torch.equal(theta, base - delta)
    assert abs(norm - float(delta.double().norm())) <= 1e-12 * max(norm, 1e-30)
