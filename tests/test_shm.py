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
