import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from atoll.core.fragments import FlatFragments, balanced_pack, make_plan
from atoll.errors import ConfigError


def _best_max_load(sizes, bins):
    vals = list(sizes.values())
    best = None
    for assign in itertools.product(range(bins), repeat=len(vals)):
        loads = [0] * bins
        for v, b in zip(vals, assign):
            loads[b] += v
        best = max(loads) if best is None else min(best, max(loads))
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=7), st.integers(1, 3))
def test_balanced_pack_within_four_thirds_of_best(vals, bins):
    sizes = {f"t{i}": v for i, v in enumerate(vals)}
    groups = balanced_pack(sizes, bins)
    assert sorted(n for g in groups for n in g) == sorted(sizes)
    worst = max(sum(sizes[n] for n in g) for g in groups)
    assert worst <= 4 / 3 * _best_max_load(sizes, bins) + 1e-9


@settings(max_examples=30, deadline=None)
@given(
    st.dictionaries(
        st.text("abc.", min_size=1, max_size=6), st.integers(1, 100), min_size=1, max_size=12
    ),
    st.integers(1, 4),
)
def test_balanced_pack_is_deterministic_whatever_the_order(sizes, bins):
    reordered = dict(reversed(list(sizes.items())))
    assert balanced_pack(sizes, bins) == balanced_pack(reordered, bins)


SHAPES = {
    "emb.weight": (256, 16),
    "b.0.w": (16, 64),
    "b.0.b": (64,),
    "b.1.w": (64, 16),
    "b.1.b": (16,),
    "head.weight": (16, 256),
}


def test_plan_embeddings_get_their_own_fragment_and_offsets_are_distinct():
    plan = make_plan(SHAPES, P=4, H=8, embeddings={"emb.weight"})
    assert plan.fragments[0].names == ("emb.weight",) and plan.fragments[0].is_embedding
    assert len({f.offset for f in plan.fragments}) == 4
    assert sorted(n for f in plan.fragments for n in f.names) == sorted(SHAPES)
    due = [p for step in range(1, 9) for p in plan.due(step)]
    assert sorted(due) == [0, 1, 2, 3]  # each fragment exactly once per H steps


def test_strided_packing_puts_layers_round_robin():
    plan = make_plan(SHAPES, P=3, H=6, embeddings={"emb.weight"}, packing="strided")
    names = [set(f.names) for f in plan.fragments[1:]]
    assert {"b.0.w", "b.0.b"} <= names[0] and {"b.1.w", "b.1.b"} <= names[1]


def test_flatten_assign_round_trip():
    import torch

    params = {n: torch.randn(s) for n, s in SHAPES.items()}
    plan = make_plan(SHAPES, P=3, H=3)
    for p in range(plan.P):
        flat = plan.flatten(params, p)
        plan.assign(params, p, flat * 2)
        assert torch.allclose(plan.flatten(params, p), flat * 2)


@pytest.mark.parametrize(
    "kw,key",
    [
        ({"P": 7, "H": 8}, "P"),  # more fragments than tensors
        ({"P": 9, "H": 8}, "P"),  # P > H
        ({"P": 2, "H": 0}, "H"),
        ({"P": 2, "H": 4, "packing": "zigzag"}, "packing"),
    ],
)
def test_bad_plans_name_the_setting(kw, key):
    with pytest.raises(ConfigError) as err:
        make_plan(SHAPES, embeddings={"emb.weight"}, **kw)
    assert err.value.setting == key


def test_a_second_layout_takes_the_buffers_the_first_laid_out():
    """A second Learner of the same model in one process (the scale benchmark's, or a user's
    after a first one closed) finds the parameters inside the first one's flat buffers: they
    are atoll's to move, so it lays them out again (one op per fragment) instead of falling
    back to per-tensor copies; a tensor that shares a storage atoll did not make still keeps
    its aliasing."""
    import gc

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    params = dict(model.named_parameters())
    shapes = {n: p.shape for n, p in params.items()}
    first = FlatFragments(make_plan(shapes, P=2, H=4), params)
    assert all(first.holds(p) for p in range(2))
    before = {n: t.detach().clone() for n, t in params.items()}
    del first
    gc.collect()
    again = FlatFragments(make_plan(shapes, P=2, H=4), params)
    assert all(again.holds(p) for p in range(2))
    other = FlatFragments(make_plan(shapes, P=3, H=4), params)  # another layout, again
    assert all(other.holds(p) for p in range(3))
    for n, t in params.items():
        torch.testing.assert_close(t.detach(), before[n])
    shared = torch.zeros(16)
    views = {"a": shared[:8], "b": shared[8:]}  # not atoll's: left as they are
    flat = FlatFragments(make_plan({n: v.shape for n, v in views.items()}, P=1, H=1), views)
    assert not flat.holds(0)
