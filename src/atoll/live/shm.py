"""Shared memory between a learner and its communication process (`Learner(comm="process")`).

One anonymous memory file (memfd, passed to the child at spawn) holds two float32 areas the
size of the model, `up` (training -> comm: contribution vectors base - theta) and `down`
(comm -> training: decoded updates), and one busy byte per fragment and direction. Fragment p
occupies the same offset in both areas: the sum of the sizes of fragments 0..p-1, plan order.

A slot is written only by its producer while its byte is 0; the producer then sets the byte
and sends a small message naming the slot; the consumer copies the vector out and clears the
byte. A producer that finds its slot still busy (the consumer has not taken the previous
vector of that fragment) sends the vector inside the message instead, as before: the shared
slots only save copies through the socket, they never hold anything back. The message over
the socket, sent after the write, orders the two (system calls are full barriers). The
consumer clears the byte with a plain store after its copy: only a CPU that never makes a
store visible before earlier loads (x86-64, total store order) guarantees the producer cannot
see the slot free while the copy still reads it, so `available()` offers the slots there
only; elsewhere every vector goes inside its message.
"""

from __future__ import annotations

import mmap
import os
import platform

import torch


def available() -> bool:
    """Shared slots on this machine: Linux memfd on an x86-64 CPU (see the module notes)."""
    return hasattr(os, "memfd_create") and platform.machine().lower() in ("x86_64", "amd64")


class SharedSlots:
    def __init__(self, fd: int, total: int, nflags: int) -> None:
        self.total, self.nflags = total, nflags
        self.map = mmap.mmap(fd, self.size(total, nflags))
        self.up = torch.frombuffer(self.map, dtype=torch.float32, count=total)
        self.down = torch.frombuffer(self.map, dtype=torch.float32, count=total, offset=4 * total)
        self.flags = memoryview(self.map)[8 * total :]
        self.offsets: list[tuple[int, int]] = []
        self._views: dict[int, list[torch.Tensor]] = {}  # id(area) -> one view per fragment

    @staticmethod
    def size(total: int, nflags: int) -> int:
        return 8 * total + 2 * nflags

    @classmethod
    def create(cls, total: int, nflags: int) -> tuple[SharedSlots, int]:
        """New slots and the file descriptor to hand to the child (inheritable)."""
        fd = os.memfd_create("atoll-learner-slots")  # close-on-exec; pass_fds hands it over
        os.ftruncate(fd, cls.size(total, nflags))
        return cls(fd, total, nflags), fd

    def layout(self, numels: list[int]) -> bool:
        """Fragment sizes in plan order; False (slots unused) if they do not fit."""
        if sum(numels) > self.total or len(numels) > self.nflags:
            return False
        off, self.offsets = 0, []
        for n in numels:
            self.offsets.append((off, n))
            off += n
        self._views = {id(a): [a[o : o + n] for o, n in self.offsets] for a in (self.up, self.down)}
        return True

    def _slot(self, area: torch.Tensor, p: int) -> tuple[torch.Tensor, int]:
        return self._views[id(area)][p], p if area is self.up else self.nflags + p

    def put(self, area: torch.Tensor, p: int, vec: torch.Tensor) -> bool:
        """Write fragment p's vector into its slot of `area`; False if the slot is busy."""
        if not self.offsets or p >= len(self.offsets):
            return False
        slot, i = self._slot(area, p)
        if self.flags[i] or vec.numel() != slot.numel():
            return False
        slot.copy_(vec.reshape(-1))
        self.flags[i] = 1
        return True

    def take(self, area: torch.Tensor, p: int) -> torch.Tensor:
        """A copy of fragment p's vector from its slot of `area`, and the slot freed."""
        slot, i = self._slot(area, p)
        out = slot.clone()
        self.flags[i] = 0
        return out
