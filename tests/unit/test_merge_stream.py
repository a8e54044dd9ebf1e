"""The streamed merge (`merge_flat`, what the syncer runs) equals the reference
`merge_fragment` (per-tensor outer gradients materialized, float64) within float rounding."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from atoll.core.merge import merge_flat, merge_fragment


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
