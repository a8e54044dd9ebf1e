import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from atoll.core.merge import merge_fragment, rda, weighted_mean

vec = st.integers(1, 20).flatmap(
    lambda n: st.lists(
        st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=n, max_size=n),
        min_size=1,
        max_size=6,
    )
)


def _ref_rda(vs, ws):
    tot = sum(ws)
    radius = sum(w * math.sqrt(sum(x * x for x in v)) for v, w in zip(vs, ws)) / tot
    d = [0.0] * len(vs[0])
    for v, w in zip(vs, ws):
        n = math.sqrt(sum(x * x for x in v))
        if n > 0:
            d = [a + w * x / n for a, x in zip(d, v)]
    dn = math.sqrt(sum(x * x for x in d))
    return [0.0] * len(d) if dn == 0 else [radius * x / dn for x in d]


def _direction_cancels(vs, ws) -> bool:
    """The unit directions' weighted sum is (nearly) zero though some input is not: its
    direction is then rounding noise (e.g. [0], [1], [-1.25] with weights 0.5, 2, 2)."""
    d = [0.0] * len(vs[0])
    for v, w in zip(vs, ws):
        n = math.sqrt(sum(x * x for x in v))
        if n > 0:
            d = [a + w * x / n for a, x in zip(d, v)]
    nonzero = any(x != 0 for v in vs for x in v)
    return nonzero and math.sqrt(sum(x * x for x in d)) <= 1e-9 * sum(ws)


@settings(max_examples=60, deadline=None)
@given(vec, st.data())
def test_rda_matches_reference(vs, data):
    ws = data.draw(st.lists(st.floats(0.01, 100), min_size=len(vs), max_size=len(vs)))
    assume(not _direction_cancels(vs, ws))
    got = rda([torch.tensor(v, dtype=torch.float64) for v in vs], ws)
    assert torch.allclose(got, torch.tensor(_ref_rda(vs, ws), dtype=torch.float64), atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(2, 50), st.floats(0.1, 10), st.integers(0, 10_000))
def test_rda_keeps_norm_when_inputs_share_it(m, n, norm, seed):
    g = torch.Generator().manual_seed(seed)
    vs = [torch.randn(n, generator=g, dtype=torch.float64) for _ in range(m)]
    vs = [v / v.norm() * norm for v in vs]
    ws = torch.rand(m, generator=g).add(0.1).tolist()
    out = rda(vs, ws)
    assert float(out.norm()) == pytest.approx(norm, rel=1e-9)
    # the plain weighted mean of nearly orthogonal vectors shrinks instead
    assert float(weighted_mean(vs, ws).norm()) <= norm + 1e-9


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.floats(0.01, 100), st.integers(0, 10_000))
def test_rda_of_one_learner_is_its_input(n, w, seed):
    v = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    assert torch.allclose(rda([v], [w]), v, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 30), st.floats(1e-3, 1e3), st.integers(0, 10_000))
def test_merges_invariant_to_scaling_weights(m, n, scale, seed):
    g = torch.Generator().manual_seed(seed)
    vs = [torch.randn(n, generator=g, dtype=torch.float64) for _ in range(m)]
    ws = torch.rand(m, generator=g).add(0.1).tolist()
    for fn in (rda, weighted_mean):
        assert torch.allclose(fn(vs, ws), fn(vs, [w * scale for w in ws]), atol=1e-9)


def test_rda_of_opposite_vectors_is_zero():
    v = torch.tensor([1.0, 2.0])
    assert torch.equal(rda([v, -v], [1.0, 1.0]), torch.zeros(2))


def test_embeddings_use_weighted_mean():
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])
    emb = merge_fragment([[a], [b]], [1.0, 1.0], is_embedding=True)[0]
    assert torch.allclose(emb, torch.tensor([1.5, 2.0]))
    other = merge_fragment([[a], [b]], [1.0, 1.0], is_embedding=False)[0]
    assert float(other.norm()) == pytest.approx(3.5)


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="weights"):
        rda([torch.ones(2)], [-1.0])
    with pytest.raises(ValueError, match="one weight per vector"):
        weighted_mean([torch.ones(2)], [1.0, 2.0])
