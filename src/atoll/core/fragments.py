"""Fragments: which parameters are synchronised together, and when.

The parameters are split into P non-overlapping fragments of whole tensors. The default,
*balanced* packing is greedy bin-packing: tensors sorted by size (largest first, ties broken by
name) go one by one into the currently lightest bin (ties broken by the lowest bin index), so
every learner computes the same layout. Embedding tensors are kept in a fragment of their own.
The *strided* packing puts layer ``l`` into fragment ``l mod P`` (tensors without a layer index
are bin-packed over all fragments afterwards).

Schedule: fragment p has offset t_p = floor(p*H/P); at step t it is sent if t mod H == t_p.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from atoll.core.choices import PACKINGS
from atoll.errors import ConfigError


@dataclass(frozen=True)
class Fragment:
    index: int
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offset: int
    is_embedding: bool

    @property
    def numels(self) -> tuple[int, ...]:
        out = []
        for s in self.shapes:
            n = 1
            for d in s:
                n *= d
            out.append(n)
        return tuple(out)

    @property
    def numel(self) -> int:
        return sum(self.numels)


def balanced_pack(sizes: Mapping[str, int], bins: int) -> list[list[str]]:
    """Greedy largest-first packing of named sizes into `bins` bins of about equal total.

    Deterministic: tensors are taken by (-size, name), and go to the lightest bin with the
    lowest index. The result is within 4/3 of the optimal largest bin (Graham's LPT bound).
    """
    if bins < 1:
        raise ConfigError("fragments", bins, "at least 1")
    loads = [0] * bins
    out: list[list[str]] = [[] for _ in range(bins)]
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        b = min(range(bins), key=lambda i: (loads[i], i))
        out[b].append(name)
        loads[b] += sizes[name]
    return out


_LAYER = re.compile(r"\.(\d+)\.")


def strided_pack(sizes: Mapping[str, int], bins: int) -> list[list[str]]:
    """Layer l goes to bin l mod `bins`; tensors outside numbered layers are bin-packed."""
    out: list[list[str]] = [[] for _ in range(bins)]
    loads = [0] * bins
    rest = {}
    for name in sorted(sizes):
        m = _LAYER.search(f".{name}")
        if m:
            b = int(m.group(1)) % bins
            out[b].append(name)
            loads[b] += sizes[name]
        else:
            rest[name] = sizes[name]
    for name in sorted(rest, key=lambda n: (-rest[n], n)):
        b = min(range(bins), key=lambda i: (loads[i], i))
        out[b].append(name)
        loads[b] += rest[name]
    return out


@dataclass(frozen=True)
class FragmentPlan:
    """The fragment layout and schedule shared by every learner and the syncer."""

    fragments: tuple[Fragment, ...]
    H: int

    def check_params(self, params: Mapping[str, torch.Tensor]) -> None:
        """A model must have exactly the plan's tensors, with the same shapes; otherwise one
        line says what differs (the first few of each kind)."""
        want = {n: s for f in self.fragments for n, s in zip(f.names, f.shapes, strict=True)}
        have = {n: tuple(p.shape) for n, p in params.items()}
        allowed = f"the syncer's {len(want)} parameters by name and shape (its init's model)"
        missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
        if missing or extra:
            parts = [f"missing {len(missing)} of the syncer's ({_few(missing)})"] if missing else []
            parts += [f"{len(extra)} the syncer lacks ({_few(extra)})"] if extra else []
            raise ConfigError("model", "; ".join(parts), allowed)
        bad = [
            f"{n} has shape {have[n]}, not {want[n]}" for n in sorted(want) if want[n] != have[n]
        ]
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            raise ConfigError("model", "; ".join(bad[:3]) + more, allowed)

    @property
    def P(self) -> int:
        return len(self.fragments)

    def due(self, step: int) -> list[int]:
        """Fragments to send after finishing local step `step` (steps count from 1)."""
        phase = (step - 1) % self.H
        return [f.index for f in self.fragments if f.offset == phase]

    def flatten(self, params: Mapping[str, torch.Tensor], p: int) -> torch.Tensor:
        """Fragment p of `params` as one flat float32 vector (a copy)."""
        f = self.fragments[p]
        return torch.cat([params[n].detach().reshape(-1).float() for n in f.names])

    def split(self, p: int, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of a flat fragment vector, one per tensor of fragment p, in plan order."""
        f = self.fragments[p]
        return [v.view(s) for v, s in zip(flat.split(list(f.numels)), f.shapes, strict=True)]

    def assign(self, params: Mapping[str, torch.Tensor], p: int, flat: torch.Tensor) -> None:
        """Write a flat fragment vector into the named tensors of `params`, in place."""
        with torch.no_grad():
            for name, v in zip(self.fragments[p].names, self.split(p, flat), strict=True):
                params[name].copy_(v)

    def nbytes_fp32(self) -> int:
        return 4 * sum(f.numel for f in self.fragments)


# each parameter FlatFragments moved, and the address of the buffer it moved it into: one still
# there (a second Learner of the same model in one process, e.g. after a first one closed) is
# atoll's to move again, though it shares that storage with the fragment's other parameters
# (by the parameter's id, dropped when the parameter is collected)
_MOVED: dict[int, int] = {}


def _moved_into(t: torch.Tensor, buf: torch.Tensor) -> None:
    if id(t) not in _MOVED:
        weakref.finalize(t, _MOVED.pop, id(t), None)
    _MOVED[id(t)] = buf.untyped_storage().data_ptr()


def _movable(t: torch.Tensor, device: torch.device) -> bool:
    """A plain float32 tensor on `device`, contiguous (not a tensor subclass, such as FSDP2's
    sharded DTensor), that alone owns its storage or lives in a buffer atoll laid out."""
    if not (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.dtype == torch.float32
        and t.device == device
        and t.is_contiguous()
    ):
        return False
    storage = t.untyped_storage()
    sole = t.storage_offset() == 0 and storage.nbytes() == 4 * t.numel()
    return sole or _MOVED.get(id(t)) == storage.data_ptr()


class FragmentStore(Protocol):
    """Where a learner's protocol reads (`flatten`) and writes (`assign`) fragment values:
    `FlatFragments`, or an island's collective version (atoll.live.learner.island)."""

    def flatten(self, p: int, copy: bool = True) -> torch.Tensor: ...

    def assign(self, p: int, flat: torch.Tensor) -> None: ...

    def device(self, p: int) -> torch.device:
        """Where the protocol keeps fragment p's values (base, latest)."""
        ...


class TensorFragments:
    """The per-tensor store: fragment p read as a copy of its tensors, flattened, and written
    back tensor by tensor (`FragmentPlan`'s path; `FlatFragments` falls back to it)."""

    def __init__(self, plan: FragmentPlan, params: Mapping[str, torch.Tensor]) -> None:
        self.plan = plan
        self.params = params

    def flatten(self, p: int, copy: bool = True) -> torch.Tensor:
        return self.plan.flatten(self.params, p)

    def assign(self, p: int, flat: torch.Tensor) -> None:
        self.plan.assign(self.params, p, flat)

    def device(self, p: int) -> torch.device:
        """Fragment p's parameters' device: where its values are kept."""
        return self.params[self.plan.fragments[p].names[0]].device


class FlatFragments(TensorFragments):
    """Each fragment's parameters laid out in one contiguous float32 buffer, in plan order, so
    that taking fragment p (`flatten`) or writing it back (`assign`) is one tensor op instead
    of one per tensor (the learner does both at step boundaries, in the training thread).

    The parameters move there (`param.data` becomes a view of the buffer: the Parameter
    objects, their gradients and the optimizer's state keyed by them are kept). A fragment is
    left as it is unless every tensor of it is float32 on one device, contiguous, and the sole
    owner of its storage (a tensor that views a shared buffer, or is laid out channels-last,
    keeps its layout and aliasing). Every call checks that the parameters still live in the
    buffer (e.g. after `model.to(...)`) and otherwise falls back to the per-tensor path of
    `FragmentPlan`."""

    def __init__(self, plan: FragmentPlan, params: Mapping[str, torch.Tensor]) -> None:
        super().__init__(plan, params)
        self.flat: list[torch.Tensor | None] = []
        self._ptrs: list[list[int]] = []
        with torch.no_grad():
            for f in plan.fragments:
                ts = [params[n] for n in f.names]
                if not all(_movable(t, ts[0].device) for t in ts):
                    self.flat.append(None)
                    self._ptrs.append([])
                    continue
                buf = torch.empty(f.numel, dtype=torch.float32, device=ts[0].device)
                off = 0
                for t, k in zip(ts, f.numels, strict=True):
                    view = buf[off : off + k].view(t.shape)
                    view.copy_(t.detach())
                    t.data = view
                    off += k
                self.flat.append(buf)
                self._ptrs.append([t.data_ptr() for t in ts])
                for t in ts:
                    _moved_into(t, buf)

    def _buffer(self, p: int) -> torch.Tensor | None:
        buf = self.flat[p]
        if buf is None:
            return None
        names = self.plan.fragments[p].names
        if [self.params[n].data_ptr() for n in names] != self._ptrs[p]:
            self.flat[p] = None  # the parameters moved: per-tensor path from now on
            return None
        return buf

    def holds(self, p: int) -> bool:
        """Whether fragment p's parameters live in its buffer (`flatten(p, copy=False)` is
        then the buffer itself)."""
        return self._buffer(p) is not None

    def flatten(self, p: int, copy: bool = True) -> torch.Tensor:
        """Fragment p as one flat float32 vector: a copy, or with `copy=False` the buffer
        itself when the parameters live there (read it before they change)."""
        buf = self._buffer(p)
        if buf is None:
            return super().flatten(p)
        return buf.clone() if copy else buf

    def assign(self, p: int, flat: torch.Tensor) -> None:
        buf = self._buffer(p)
        if buf is None:
            super().assign(p, flat)
        else:
            buf.copy_(flat)


def make_plan(
    shapes: Mapping[str, Sequence[int]],
    P: int,
    H: int,
    embeddings: set[str] | frozenset[str] = frozenset(),
    packing: str = "balanced",
) -> FragmentPlan:
    """Split named tensors into P fragments and give them distinct offsets in [0, H)."""
    if H < 1:
        raise ConfigError("H", H, "an integer >= 1 (inner steps per fragment cycle)")
    if P < 1 or P > H:
        raise ConfigError("P", P, f"an integer in [1, H={H}] so every fragment gets its own offset")
    emb = sorted(n for n in shapes if n in embeddings)
    rest = {n: _numel(s) for n, s in shapes.items() if n not in embeddings}
    n_bins = P - (1 if emb else 0)
    if n_bins < 1 or len(rest) < n_bins:
        raise ConfigError(
            "P",
            P,
            f"at most the number of tensors: {len(rest)} non-embedding tensors"
            + (" plus one embedding fragment" if emb else ""),
        )
    if packing == "balanced":
        groups = balanced_pack(rest, n_bins)
    elif packing == "strided":
        groups = strided_pack(rest, n_bins)
        if any(not g for g in groups):
            raise ConfigError("P", P, "at most the number of layers for strided packing")
    else:
        raise ConfigError("packing", packing, f"one of {', '.join(PACKINGS)}")
    if emb:
        groups = [emb] + groups
    frags = []
    for i, names in enumerate(groups):
        ordered = tuple(sorted(names))
        frags.append(
            Fragment(
                index=i,
                names=ordered,
                shapes=tuple(tuple(shapes[n]) for n in ordered),
                offset=(i * H) // P,
                is_embedding=bool(emb) and i == 0,
            )
        )
    return FragmentPlan(fragments=tuple(frags), H=H)


def _few(names: Sequence[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f", ... {len(names) - n} more" if len(names) > n else "")


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
