"""Shared slots between a learner and its communication process (atoll.live.shm)."""

import os

import torch

from atoll.live.shm import SharedSlots


def test_slots_pass_vectors_and_refuse_a_busy_slot():
    a, fd = SharedSlots.create(total=10, nflags=3)
    b = SharedSlots(fd, 10, 3)  # the other side's mapping of the same memory
    os.close(fd)
    assert a.layout([4, 6]) and b.layout([4, 6])
    v0, v1 = torch.arange(4.0), torch.arange(6.0) + 10
    assert a.put(a.up, 0, v0) and a.put(a.up, 1, v1)
    assert not a.put(a.up, 0, v0 + 1)  # not taken yet: the producer must send it inline
    assert torch.equal(b.take(b.up, 0), v0) and torch.equal(b.take(b.up, 1), v1)
    assert a.put(a.up, 0, v0 + 1) and torch.equal(b.take(b.up, 0), v0 + 1)  # free again
    assert b.put(b.down, 1, v1 * 2) and torch.equal(a.take(a.down, 1), v1 * 2)  # other way
    taken = b.take(b.up, 1)
    b.up.fill_(0)
    assert torch.equal(taken, v1)  # a copy, not a view of the slot
    assert not a.put(a.up, 0, torch.zeros(5))  # wrong size: inline


def test_layout_that_does_not_fit_disables_the_slots():
    s, fd = SharedSlots.create(total=8, nflags=2)
    os.close(fd)
    assert not s.layout([4, 5]) and not s.layout([2, 2, 2])
    assert not s.put(s.up, 0, torch.zeros(4))


def test_flat_fragments_keep_parameters_optimizer_state_and_fall_back_when_moved():
    from atoll.core.fragments import FlatFragments, make_plan

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    params = dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    ids = {n: id(p) for n, p in params.items()}
    plan = make_plan({n: tuple(p.shape) for n, p in params.items()}, 2, 2)
    flat = FlatFragments(plan, params)
    assert all(b is not None for b in flat.flat)  # every fragment packed
    assert {n: id(p) for n, p in model.named_parameters()} == ids  # same Parameter objects
    for n, p in params.items():
        assert torch.equal(p.detach(), before[n])
    assert torch.equal(flat.flatten(0), plan.flatten(params, 0))
    model(torch.randn(5, 4)).sum().backward()
    opt.step()  # the optimizer (its state kept) updates the buffers in place
    assert torch.equal(flat.flatten(1, copy=False), plan.flatten(params, 1))
    flat.assign(0, torch.zeros(plan.fragments[0].numel))
    assert all((params[n] == 0).all() for n in plan.fragments[0].names)
    model.double().float()  # the parameters move: the per-tensor path from then on
    flat.assign(1, torch.ones(plan.fragments[1].numel))
    assert all((params[n] == 1).all() for n in plan.fragments[1].names)
    assert flat.flat[1] is None


def test_flat_fragments_leave_shared_or_strided_tensors_alone():
    from atoll.core.fragments import FlatFragments, make_plan

    base = torch.zeros(10)
    shared = {"a": torch.nn.Parameter(base[:4].view(2, 2)), "b": torch.nn.Parameter(base[4:])}
    plan = make_plan({n: tuple(p.shape) for n, p in shared.items()}, 1, 1)
    flat = FlatFragments(plan, shared)
    assert flat.flat == [None]
    shared["a"].data.fill_(3.0)
    assert (base[:4] == 3).all()  # still aliased: nothing was moved
    assert torch.equal(flat.flatten(0), plan.flatten(shared, 0))
