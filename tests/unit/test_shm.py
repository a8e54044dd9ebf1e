"""Shared slots between a learner and its communication process (atoll.live.shm)."""

import os

import torch

from atoll.live.shm import SharedSlots


def test_slots_pass_vectors_and_go_inline_when_none_is_free():
    a, fd = SharedSlots.create(total=12, nflags=3)
    b = SharedSlots(fd, 12, 3)  # the other side's mapping of the same memory
    os.close(fd)
    assert a.layout([4, 6]) and b.layout([4, 6])
    assert a.count == 2  # two slots of 6 values fit the 12 (at most nflags, at most SLOTS)
    v0, v1 = torch.arange(4.0), torch.arange(6.0) + 10
    assert a.put(a.up, 0, v0) == 0 and a.put(a.up, 1, v1) == 1
    assert a.put(a.up, 0, v0 + 1) is None  # none taken yet: the producer sends it inline
    assert torch.equal(b.take(b.up, 0, 0), v0) and torch.equal(b.take(b.up, 1, 1), v1)
    assert a.put(a.up, 1, v1 + 1) == 0 and torch.equal(b.take(b.up, 0, 1), v1 + 1)  # free again
    assert b.put(b.down, 1, v1 * 2) == 0 and torch.equal(a.take(a.down, 0, 1), v1 * 2)  # down
    assert a.put(a.up, 1, v1) == 0
    taken = b.take(b.up, 0, 1)
    b.up.fill_(0)
    assert torch.equal(taken, v1)  # a copy, not a view of the slot
    assert a.put(a.up, 0, torch.zeros(5)) is None  # not fragment 0's size: inline
    assert a.put(a.up, 2, torch.zeros(4)) is None  # no such fragment: inline


def test_slots_take_memory_for_a_few_fragments_not_the_model():
    from atoll.live.shm import SLOTS

    total, numels = 24_000, [1000] * 24  # a model in 24 fragments
    s, fd = SharedSlots.create(total, nflags=24)
    os.close(fd)
    assert s.layout(numels) and s.count == SLOTS
    assert s.resident_bytes() == 2 * SLOTS * 4 * 1000  # not 2 x 4 x 24000
    for p in range(24):  # every fragment once each way, taken at once: the first slot only
        vec = torch.full((1000,), float(p))
        assert s.put(s.up, p, vec) == 0 and torch.equal(s.take(s.up, 0, p), vec)
        assert s.put(s.down, p, vec) == 0 and torch.equal(s.take(s.down, 0, p), vec)
    assert not s.up[1000:].any() and not s.down[1000:].any()  # nothing else was written


def test_a_reserved_slot_is_written_in_place_and_a_viewed_one_freed_after_reading():
    a, fd = SharedSlots.create(total=12, nflags=2)
    b = SharedSlots(fd, 12, 2)
    os.close(fd)
    assert a.layout([4, 6]) and b.layout([4, 6])
    slot, view = a.reserve(a.up, 1)
    assert (slot, view.numel()) == (0, 6)
    assert a.reserve(a.up, 0)[0] == 1  # the reserved one is not handed out twice
    assert a.reserve(a.up, 0) is None and a.put(a.up, 0, torch.zeros(4)) is None
    a.release(a.up, 1)  # the second reservation given back unused
    torch.sub(torch.arange(6.0), 1.0, out=view)  # written in place: no copy at the hand-over
    a.commit(a.up, slot)
    assert torch.equal(b.take(b.up, 0, 1), torch.arange(6.0) - 1)
    a.release(a.up)  # nothing reserved: nothing changes
    assert a.reserve(a.up, 1)[0] == 0  # free again
    assert b.put(b.down, 0, torch.ones(4)) == 0
    seen = a.view(a.down, 0, 0)
    assert torch.equal(seen, torch.ones(4)) and b.put(b.down, 0, torch.ones(4)) == 1  # busy
    a.free(a.down, 0)
    assert b.put(b.down, 0, torch.ones(4)) == 0


def test_layout_that_does_not_fit_disables_the_slots():
    s, fd = SharedSlots.create(total=8, nflags=2)
    os.close(fd)
    assert not s.layout([4, 9]) and not s.layout([])
    assert s.put(s.up, 0, torch.zeros(4)) is None
    assert s.layout([4, 4]) and s.count == 2


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
