"""The public versions of each fragment the syncer keeps (`History`): what a learner's base
version is resolved against (its contribution is taken against the value it started from),
what a resuming learner's base versions are checked against, and what an update sent in full
instead of queued deltas is encoded from.

Held as the learners hold them, not as 64 fp32 copies:
- the newest version is the public value itself (shared: the protocol never changes a tensor
  in place, it replaces it), and the `RECENT` newest are kept in full;
- an older version is kept as the frame that was broadcast to reach it (the quantized delta
  from the version before: exactly what every learner applied, int4 is ~1/7 of fp32), except
  every `full_every`-th version and the oldest held, which are kept in full (checkpoints);
- resolving version v is exact: from the newest full version u <= v, the frames u+1..v are
  decoded and added in order, the same float32 operations the broadcast made
  (`public + decode(frame)`), so the value is bit for bit the one the learners hold;
- at most `keep` versions are held, and with `max_bytes` > 0 at most that many bytes (each
  fragment its share by size; the newest is never dropped): the oldest go first, and the
  next oldest is then made full (exact, one decode). A learner whose base is no longer held
  is refused (`stale_base`) and heals; one that resumes on it heals.

Versions brought back from a snapshot or a tape record are full values (no frames): they
count in full until they age out. `full_every = 1` keeps every version in full (the memory of
a plain list of copies). One resolved older version is cached (the M contributions of a
round are usually based on the same one).

`full_every = 0` (frames only): no full value but the newest (the public value, shared) and
versions restored in full; version v is resolved backward from the nearest full version
u > v: `value(u) - decode(frame_u) - ... - decode(frame_{v+1})`. Not bit-exact: each
subtraction rounds to float32, so the value differs from the one the learners hold by a few
float32 ulps per version between v and u (measured in tests/unit/test_history_frames.py;
far below the int4 quantization of any contribution), and as newer versions arrive (the
full value moves to the newest) a version's resolved value may change in its last bits.
Memory: `keep - 1` frames per fragment, nothing in full once warm.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch

from atoll.core import codec

RECENT = 2  # newest versions of a fragment always kept in full (the newest is shared)


class _Versions(Mapping[int, torch.Tensor]):
    """One fragment's held versions, as a read-only mapping version -> public value."""

    def __init__(self, hist: History, p: int) -> None:
        self.hist, self.p = hist, p

    def __getitem__(self, v: int) -> torch.Tensor:
        return self.hist.value(self.p, v)

    def __contains__(self, v: object) -> bool:
        return v in self.hist.held_v[self.p]

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.hist.held_v[self.p]))

    def __len__(self) -> int:
        return len(self.hist.held_v[self.p])


class History:
    def __init__(
        self,
        values: Sequence[torch.Tensor],
        keep: int,
        full_every: int = 16,
        max_bytes: int = 0,
    ) -> None:
        self.keep, self.full_every, self.max_bytes = keep, full_every, max_bytes
        P = len(values)
        self.held_v: list[OrderedDict[int, None]] = [OrderedDict({0: None}) for _ in range(P)]
        self.full: list[dict[int, torch.Tensor]] = [{0: v.clone()} for v in values]
        self.frames: list[dict[int, bytes]] = [{} for _ in range(P)]
        total = sum(v.numel() for v in values) or 1
        self.share = [v.numel() / total for v in values]  # each fragment's share of max_bytes
        self._cache: tuple[int, int, torch.Tensor] | None = None  # (p, version, value)

    def __getitem__(self, p: int) -> _Versions:
        return _Versions(self, p)

    def __len__(self) -> int:
        return len(self.held_v)

    def held(self, p: int) -> _Versions | None:
        """Fragment p's versions (None for a fragment index out of range)."""
        return _Versions(self, p) if 0 <= p < len(self.held_v) else None

    def holds_all(self, versions: Sequence[int], fragments: Iterable[int] | None = None) -> bool:
        """Every fragment's given version is still held (one version per fragment; of
        `fragments` only, when given: a shard's)."""
        ps = range(len(versions)) if fragments is None else fragments
        return all(versions[p] in self.held_v[p] for p in ps)

    def value(self, p: int, v: int) -> torch.Tensor:
        """Fragment p's public value of version v, exact (frames only, `full_every = 0`:
        to float32 rounding, module docstring; KeyError: not held)."""
        if v not in self.held_v[p]:
            raise KeyError(v)
        full = self.full[p]
        if v in full:
            return full[v]
        if self._cache is not None and self._cache[:2] == (p, v):
            return self._cache[2]
        if not self.full_every:
            return self._backward(p, v)
        u = v - 1
        while u not in full:  # the newest full version before v (the oldest held is full)
            u -= 1
        value = full[u]
        if self._cache is not None and self._cache[0] == p and u < self._cache[1] < v:
            u, value = self._cache[1], self._cache[2]  # go on from the cached version
        for w in range(u + 1, v + 1):
            value = value + codec.decode(self.frames[p][w])  # as the broadcast made it
        self._cache = (p, v, value)
        return value

    def _backward(self, p: int, v: int) -> torch.Tensor:
        """Frames only: from the nearest full version above v (or the cached one, if nearer),
        the frames subtracted in order, newest first."""
        full, frames = self.full[p], self.frames[p]
        u = v + 1
        while u not in full:  # every frame from v+1 up to a full version is held (_thin)
            u += 1
        value = full[u]
        if self._cache is not None and self._cache[0] == p and v < self._cache[1] < u:
            u, value = self._cache[1], self._cache[2]
        for w in range(u, v, -1):
            value = value - codec.decode(frames[w])
        self._cache = (p, v, value)
        return value

    def remember(self, p: int, version: int, public: torch.Tensor, frame: bytes | None = None):
        """Fragment p's `public` value of `version`, the newest (held as is, not copied);
        `frame`: the delta from the version before as broadcast (None: sent in full)."""
        held = self.held_v[p]
        if version in held:  # the same version again (a restore): a full value, no frame
            self._drop(p, version)
        held[version] = None
        self.full[p][version] = public
        if frame is not None and version - 1 in held:
            self.frames[p][version] = frame
        self._thin(p)
        while len(held) > self.keep or (len(held) > 1 and self._over(p)):
            self._evict_oldest(p)

    def newest(self, p: int, n: int) -> dict[int, torch.Tensor]:
        """Fragment p's newest `n` versions (full ones are the held tensors; older ones are
        made, in order, each from the one before)."""
        if not self.full_every:
            return self._newest_backward(p, n)
        out: dict[int, torch.Tensor] = {}
        prev: tuple[int, torch.Tensor] | None = None
        for v in list(self.held_v[p])[-n:]:
            if v in self.full[p]:
                t = self.full[p][v]
            elif prev is not None and prev[0] == v - 1:
                t = prev[1] + codec.decode(self.frames[p][v])
            else:
                t = self.value(p, v)
            out[v] = prev_t = t
            prev = (v, prev_t)
        return out

    def _newest_backward(self, p: int, n: int) -> dict[int, torch.Tensor]:
        """`newest` with frames only: each from the one after it, as `_backward` does."""
        out: dict[int, torch.Tensor] = {}
        after: tuple[int, torch.Tensor] | None = None
        for v in reversed(list(self.held_v[p])[-n:]):
            if v in self.full[p]:
                t = self.full[p][v]
            elif after is not None and after[0] == v + 1:
                t = after[1] - codec.decode(self.frames[p][v + 1])
            else:
                t = self.value(p, v)
            out[v] = t
            after = (v, t)
        return dict(sorted(out.items()))

    def load(self, p: int, versions: dict[int, torch.Tensor], replace: bool) -> None:
        """Add (copies of) `versions` to what is held of fragment p, or replace it."""
        if replace:
            self.held_v[p], self.full[p], self.frames[p] = OrderedDict(), {}, {}
        for v, t in sorted(versions.items()):
            if v in self.held_v[p]:
                self._drop(p, v)
            self.held_v[p][v] = None
            self.full[p][v] = t.clone()
        self._cache = None

    # -- memory --------------------------------------------------------------------------------
    def fragment_bytes(self, p: int) -> int:
        """What fragment p's history holds beyond the public value (the newest, shared)."""
        newest = next(reversed(self.held_v[p]), None)
        full = sum(t.numel() * t.element_size() for v, t in self.full[p].items() if v != newest)
        return full + sum(len(f) for f in self.frames[p].values())

    def nbytes(self) -> int:
        """Bytes held by every fragment's history beyond the public values, and the cache."""
        cached = 0 if self._cache is None else self._cache[2].numel() * 4
        return sum(self.fragment_bytes(p) for p in range(len(self))) + cached

    def _over(self, p: int) -> bool:
        return self.max_bytes > 0 and self.fragment_bytes(p) > self.max_bytes * self.share[p]

    def _thin(self, p: int) -> None:
        """Keep in full only the RECENT newest, every full_every-th and the oldest held
        (frames only: those that cannot be reached backward by frames from the newest)."""
        held = list(self.held_v[p])
        if not self.full_every:
            frames, full = self.frames[p], self.full[p]
            reached = True  # the newest is full
            for v in reversed(held[:-1]):
                if reached and v + 1 in frames:
                    full.pop(v, None)  # resolved backward from v + 1
                else:
                    reached = v in full
            return
        for v in held[1:-RECENT]:
            if v not in self.full[p]:
                continue
            if v % self.full_every and v in self.frames[p]:
                del self.full[p][v]  # kept as its frame
            else:
                self.frames[p].pop(v, None)  # a checkpoint: its frame is not needed

    def _evict_oldest(self, p: int) -> None:
        held = self.held_v[p]
        oldest = next(iter(held))
        nxt = list(held)[1]
        if nxt not in self.full[p] and self.full_every:
            self.full[p][nxt] = self.value(p, nxt)  # exact: one decode from the oldest
        self._drop(p, oldest)
        self.frames[p].pop(nxt, None)  # its base is gone: it is full now

    def _drop(self, p: int, v: int) -> None:
        if not self.full_every and v in self.held_v[p]:
            self._pin_below(p, v)
        self.held_v[p].pop(v, None)
        self.full[p].pop(v, None)
        self.frames[p].pop(v, None)
        if self._cache is not None and self._cache[0] == p:
            self._cache = None

    def _pin_below(self, p: int, v: int) -> None:
        """Frames only, before version v (or its frame) goes: the versions below v that are
        resolved through it are made full, as they resolve now."""
        held, full, frames = self.held_v[p], self.full[p], self.frames[p]
        u = v - 1
        if u not in held or u in full:
            return
        t = self.value(p, v)
        while u in held and u not in full:
            t = t - codec.decode(frames[u + 1])
            full[u] = t
            u -= 1
