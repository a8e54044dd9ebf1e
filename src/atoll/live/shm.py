"""Shared memory between a learner and its communication process (`Learner(comm="process")`).

One anonymous memory file (memfd, passed to the child at spawn) holds two float32 areas,
`up` (training -> comm: contribution vectors base - theta) and `down` (comm -> training:
decoded updates), and one busy byte per slot. Each area is a pool of `SLOTS` slots, each the
size of the largest fragment (fewer when they would not fit the file: at least one): a
vector goes into the first free slot of its direction and the message names that slot (an
int). The file is sized at spawn for the whole model (before the plan is known), but memory
is only taken by the pages written, so the slots cost 2 x SLOTS fragments, not the model
twice over (`resident_bytes`).

A slot is written only by its producer while its byte is 0 (it may `reserve` one and have
the vector computed straight into it, then `commit`); the producer then sets the byte and
sends a small message naming the slot; the consumer copies the vector out (`take`), or reads
it in place (`view`) and then `free`s it, clearing the byte. A producer that finds no slot
free (the consumer has not taken the previous vectors) sends the vector inside the message
instead, as before: the shared slots only save copies through the socket, they never hold
anything back. The message over the socket, sent after the write, orders the two (system
calls are full barriers). The consumer clears the byte with a plain store after its copy
(or read): only a CPU that never makes a store visible before earlier loads (x86-64, total
store order) guarantees the producer cannot see the slot free while the copy still reads it,
so `available()` offers the slots there only; elsewhere every vector goes inside its message.
"""

from __future__ import annotations

import mmap
import os
import platform

import torch

SLOTS = 2  # per direction: vectors handed over and not yet taken, beyond which they go inline


def available() -> bool:
    """Shared slots on this machine: Linux memfd on an x86-64 CPU (see the module notes)."""
    return hasattr(os, "memfd_create") and platform.machine().lower() in ("x86_64", "amd64")


class SharedSlots:
    def __init__(self, fd: int, total: int, nflags: int) -> None:
        """`total`: the values each area may hold (the model's); `nflags`: busy bytes per
        direction (at most that many slots)."""
        self.total, self.nflags = total, nflags
        self.map = mmap.mmap(fd, self.size(total, nflags))
        self.up = torch.frombuffer(self.map, dtype=torch.float32, count=total)
        self.down = torch.frombuffer(self.map, dtype=torch.float32, count=total, offset=4 * total)
        self.flags = memoryview(self.map)[8 * total :]
        self.sizes: list[int] = []  # values per fragment, plan order
        self.count = 0  # slots per direction (0: not laid out, unused)
        self._views: dict[int, list[torch.Tensor]] = {}  # id(area) -> its slots, whole
        self._held: set[tuple[int, int]] = set()  # (id(area), slot) reserved by this producer

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
        """Fragment sizes in plan order; False (slots unused) if not one slot fits."""
        big = max(numels, default=0)
        count = min(SLOTS, self.nflags, self.total // big) if big > 0 else 0
        if count < 1:
            self.count = 0
            return False
        self.sizes, self.count = list(numels), count
        self._views = {
            id(a): [a[i * big : (i + 1) * big] for i in range(count)] for a in (self.up, self.down)
        }
        return True

    def resident_bytes(self) -> int:
        """The most memory the slots can take (pages written): 2 directions x count x slot."""
        return 2 * self.count * 4 * max(self.sizes, default=0)

    def _flag(self, area: torch.Tensor, slot: int) -> int:
        return slot if area is self.up else self.nflags + slot

    def reserve(self, area: torch.Tensor, p: int) -> tuple[int, torch.Tensor] | None:
        """A free slot of `area` for fragment p's vector, held for this producer until it
        `commit`s or `release`s it: (its number, the view to write), or None (no slot free,
        or not laid out for it: the vector goes inline)."""
        if p >= len(self.sizes):
            return None
        for slot in range(self.count):
            if not self.flags[self._flag(area, slot)] and (id(area), slot) not in self._held:
                self._held.add((id(area), slot))
                return slot, self._views[id(area)][slot][: self.sizes[p]]
        return None

    def commit(self, area: torch.Tensor, slot: int) -> None:
        """The reserved slot holds its vector: the consumer may take it."""
        self._held.discard((id(area), slot))
        self.flags[self._flag(area, slot)] = 1

    def release(self, area: torch.Tensor, slot: int | None = None) -> None:
        """Give back a reserved slot unused (every one of `area` when `slot` is None)."""
        held = [(a, s) for a, s in self._held if a == id(area) and slot in (None, s)]
        self._held.difference_update(held)

    def put(self, area: torch.Tensor, p: int, vec: torch.Tensor) -> int | None:
        """Write fragment p's vector into a free slot of `area`: its number, or None (no slot
        free, or not laid out for it: the vector goes inline)."""
        if p >= len(self.sizes) or vec.numel() != self.sizes[p]:
            return None
        got = self.reserve(area, p)
        if got is None:
            return None
        got[1].copy_(vec.reshape(-1))
        self.commit(area, got[0])
        return got[0]

    def view(self, area: torch.Tensor, slot: int, p: int) -> torch.Tensor:
        """Fragment p's vector in `slot` of `area`, in place: read it, then `free` the slot."""
        return self._views[id(area)][slot][: self.sizes[p]]

    def free(self, area: torch.Tensor, slot: int) -> None:
        """The consumer is done with `slot` of `area`: the producer may write it again."""
        self.flags[self._flag(area, slot)] = 0

    def take(self, area: torch.Tensor, slot: int, p: int) -> torch.Tensor:
        """A copy of fragment p's vector from `slot` of `area`, and the slot freed."""
        out = self.view(area, slot, p).clone()
        self.free(area, slot)
        return out
