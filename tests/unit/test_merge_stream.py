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
