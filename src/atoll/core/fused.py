"""The syncer round's fused data path: numba kernels (core/fused_kernels.py) that measure a
contribution from its frame alone and hold it as that frame (`Held`: 0.5 byte a value for
int4, not 4), then merge a round from the held frames (two passes: the norms, the weighted
sum) and close it (outer step, broadcast encode with its error carried in the public value)
in one pass, a cache-sized block at a time, on `syncer_threads` threads.

The torch path (core/quant.py, merge.py, outer.py, delivery.py) stays the reference and the
fallback: the fused one computes the same float32 values in the same order; its float64 sums
(the norms) are added in another order, so a merged value may differ in its last bit (and an
int4 code then flip): tests/unit/test_fused.py holds them together. The frame format is the
same, and for the same input the encoder writes the same bytes.

`fused` (a setting of the syncer): "auto" (the default) takes the kernels for fragments of at
least MIN_VALUES values (smaller ones cost more to hand over than to compute, and a process
that never meets a large one never loads numba); "on": every fragment; "off": never. A kernel
that cannot be compiled or loaded here is said once in a log line, and the round goes on by
the reference path. numba caches the compiled kernels beside this file's __pycache__ (or, when
the install is read-only, in the user's cache directory): the first round of a new install
compiles them (tens of seconds), later processes load them (about a second).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from atoll.core import codec, quant
from atoll.core.choices import check_fused as check
from atoll.core.choices import cores

MIN_VALUES = 1 << 18
HOLDABLE = ("int8", "int4", "bf16")  # the schemes of the frames a round holds
log = logging.getLogger("atoll.syncer")

_load_lock = threading.Lock()
_lock = threading.Lock()  # one kernel at a time (numba's default thread pool is not reentrant)
_mode = {"fused": "auto", "threads": 0}
_loaded: dict[str, Any] = {}
_pool: list[torch.Tensor] = []  # buffers a committed round let go of (`give`)
_pool_lock = threading.Lock()
POOL = 6


def configure(fused: str = "auto", threads: str = "auto") -> None:
    """This process's choice (its syncer's settings)."""
    _mode["fused"], _mode["threads"] = fused, check(fused, threads)
    if _loaded.get("kernels") is not None:
        _set_threads()


def _set_threads() -> None:
    import numba

    numba.set_num_threads(min(_mode["threads"] or cores(), numba.config.NUMBA_NUM_THREADS))


def kernels(n: int) -> Any | None:
    """The compiled kernels for a fragment of `n` values, or None: the reference path."""
    mode = _mode["fused"]
    if mode == "off" or (mode == "auto" and n < MIN_VALUES):
        return None
    if "kernels" not in _loaded:
        with _load_lock:  # (a driver's threads may ask at once: SyncerProtocol.prepare)
            if "kernels" not in _loaded:
                _loaded["kernels"] = _load()
    return _loaded["kernels"]


def _load() -> Any | None:
    try:
        k = importlib.import_module("atoll.core.fused_kernels")
        _set_threads()
        _warm(k)
        return k
    except Exception as exc:  # noqa: BLE001 - any failure to build: the reference path
        log.warning("fused kernels unavailable (%s: %s): rounds take the torch path",
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")  # fmt: skip
        return None


def _warm(k: Any) -> None:
    """Compile (or load from the cache) every kernel with the argument types rounds use."""

    f = np.zeros(4, dtype=np.float32)
    body = np.frombuffer(bytes(8), dtype=np.uint8)  # a frame's body: read-only
    held = dataclasses.replace(hold(k, "int4", 4, 4, body, f)[0], base=torch.zeros(4))
    b = np.zeros(1, dtype=np.int64)
    args = _held_args(k, [held])
    k.held_squares(f, *args, b, b + 4)
    k.held_sum(f, *args, np.ones((1, 1)), b, b, b + 4, f.copy())
    k.step_encode(f, f, np.ones(1, dtype=np.float32), b + 4, np.float32(1), 0, np.float32(1),
                  np.float32(0.9), f, f, 4, 7, True, f.copy(), f.copy(), f.copy(),
                  np.ones(1, dtype=np.float32), np.zeros(2, dtype=np.uint8), 4)  # fmt: skip


def _np(t: torch.Tensor) -> Any:
    return t.detach().numpy()


@dataclasses.dataclass
class Held:
    """A contribution held as its frame's body until its round closes: its values
    theta_m = base - the body's values are decoded where the close reads them, a block at a
    time (never whole in memory: a pending contribution costs its frame, not 4 bytes a value).
    `body`: the codes (bf16: the values' bits, two bytes each), read-only; `sf`: the float32
    scale of each group (none for bf16); `base`: the public value of its base version."""

    scheme: str
    group: int
    body: Any  # numpy uint8
    sf: Any  # numpy float32
    base: torch.Tensor | None
    numel: int

    def values(self) -> torch.Tensor:
        """theta_m whole, as the reference decodes it (core/quant.py)."""
        raw = torch.from_numpy(self.body.copy())
        if self.scheme == "bf16":
            out = raw.view(torch.bfloat16).float()
            return torch.sub(self.base, out[: self.numel], out=out[: self.numel])
        out = torch.empty(-(-self.numel // self.group) * self.group)
        quant.dequantize(raw, torch.from_numpy(self.sf), self.group, self.scheme, out, self.base)
        return out[: self.numel]


def hold(
    k: Any, scheme: str, numel: int, group: int, body: Any, sf: Any
) -> tuple[Held, float, float]:
    """A frame's body held (`Held`, its base still to be set): (it, the sum of its values'
    squares, for bf16 the largest |value| (inf or nan: one is not finite), else 0)."""
    body.flags.writeable = False
    group = 1 if scheme == "bf16" else group
    with _lock:
        part, top = k.body_squares(body, sf, group, _code(k, scheme), numel)
    biggest = _f32(top.max() if len(top) else 0)
    return Held(scheme, group, body, sf, None, numel), float(part.sum()), biggest


def _code(k: Any, scheme: str) -> int:
    """The kernels' number for a held body's scheme (one of HOLDABLE)."""
    return {"int8": k.INT8, "int4": k.INT4, "bf16": k.BF16}[scheme]


def _f32(bits: Any) -> float:
    """The float32 whose bits are the uint32 `bits` (a kernel's largest |value|)."""
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def give(*tensors: torch.Tensor | None) -> None:
    """Tensors a committed round let go of (its old theta, public value, momentum): a later
    close writes into one of them once nothing else holds it (`_take`). A fresh buffer costs
    a page fault per 4 KiB on its first write, about 25 ms per 16M values here."""
    if _loaded.get("kernels") is None:
        return
    with _pool_lock:
        for t in tensors:
            if (
                t is not None and t.dtype == torch.float32 and t.numel() >= MIN_VALUES
                and t._base is None and t.is_contiguous() and all(t is not x for x in _pool)
            ):  # fmt: skip
                _pool.append(t)
        del _pool[:-POOL]


def _take(n: int) -> torch.Tensor:
    """A float32 buffer of n values: one `give` handed over that nothing else holds (no
    reference but the pool's, no view of its memory), else a new one."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    with _pool_lock:
        for i in range(len(_pool)):
            if _pool[i].numel() != n or use_count is None:
                continue
            if sys.getrefcount(_pool[i]) == 2 and use_count(_pool[i].untyped_storage()._cdata) == 2:
                return _pool.pop(i)
    return torch.empty(n)


def _held_args(k: Any, held: Sequence[Held]) -> tuple:
    from numba.typed import List

    groups = np.asarray([h.group for h in held], dtype=np.int64)
    return (List([h.body for h in held]), List([h.sf for h in held]), groups,
            _code(k, held[0].scheme),
            List([_np(h.base) for h in held]))  # fmt: skip


@functools.lru_cache(maxsize=64)
def _blocks(block: int, sizes: tuple[int, ...]) -> tuple[Any, Any, Any]:
    """(tensor, start, end) of each block: `block` values at most, never across a tensor
    (the same arrays for every round of a fragment: the kernels only read them)."""
    bt, bs, be = [], [], []
    start = 0
    for t, size in enumerate(sizes):
        for s in range(start, start + size, block):
            bt.append(t)
            bs.append(s)
            be.append(min(s + block, start + size))
        start += size
    as64 = [np.asarray(x, dtype=np.int64) for x in (bt, bs, be)]
    return as64[0], as64[1], as64[2]


def _per_tensor(part: Any, bt: Any, t_count: int) -> list[float]:
    """Block partials summed per tensor, in block order."""
    out = [0.0] * t_count
    for b, t in enumerate(bt.tolist()):
        out[t] += float(part[b])
    return out


def merge(
    k: Any, theta: torch.Tensor, held: Sequence[Held], w: Sequence[float],
    sizes: Sequence[int], mean: bool, cancelled: float,
) -> tuple[torch.Tensor, list[float]]:  # fmt: skip
    """`merge.merge_flat` of the held contributions before its last step: (sum_m c[m,t]
    (theta - theta_m) as float32, the factor of each tensor t to multiply it by). `w`: the
    normalized weights."""
    bt, bs, be = _blocks(k.BLOCK, tuple(sizes))
    m_count, t_count = len(held), len(sizes)
    th = _np(theta)
    out = torch.empty(theta.numel(), dtype=torch.float32)
    args = _held_args(k, held)

    def sums(coef: Any) -> Any:
        return k.held_sum(th, *args, coef, bt, bs, be, _np(out))

    with _lock:
        if mean:
            sums(np.repeat(np.asarray(w, dtype=np.float64)[:, None], t_count, axis=1))
            return out, [1.0] * t_count
        sq = k.held_squares(th, *args, bs, be)
        norms = [[s**0.5 for s in _per_tensor(sq[m], bt, t_count)] for m in range(m_count)]
        coef = np.array([[w[m] / n if n > 0 else 0.0 for n in norms[m]] for m in range(m_count)])
        dn = [s**0.5 for s in _per_tensor(sums(coef), bt, t_count)]
    scale = []
    for t in range(t_count):
        radius = sum(w[m] * norms[m][t] for m in range(m_count))
        live = sum(w[m] for m in range(m_count) if norms[m][t] > 0)
        scale.append(0.0 if dn[t] <= cancelled * live else radius / dn[t])
    return out, scale


def step_encode(
    k: Any,
    theta: torch.Tensor,
    delta: torch.Tensor,
    tscale: Sequence[float],
    sizes: Sequence[int],
    light: float,
    kind: str,
    lr: float,
    mu: float,
    buf: torch.Tensor | None,
    public: torch.Tensor,
    scheme: str,
    group: int,
    qmax: int,
) -> tuple[bool, float, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, bytearray]:
    """The close after the merge (fused_kernels.step_encode): (all finite, the largest
    |change|, new theta, new momentum buffer or None, new public value, the bf16 scales,
    the frame's body before compression)."""
    n = theta.numel()
    g = max(1, min(group, n))
    n_groups = -(-n // g)
    body = bytearray(codec.body_len(scheme, n, g))
    raw = np.frombuffer(body, dtype=np.uint8)
    scales = np.empty(n_groups, dtype=np.float32)
    new_theta, new_public = _take(n), _take(n)
    nesterov = kind == "nesterov"
    new_buf = _take(n) if nesterov else None
    bufv = _np(buf) if nesterov and buf is not None else np.zeros(0 if not nesterov else n,
                                                                   dtype=np.float32)  # fmt: skip
    tend = np.cumsum(np.asarray(sizes, dtype=np.int64))
    f32 = np.float32
    with _lock:
        ok, top_bits = k.step_encode(
            _np(theta), _np(delta), np.asarray(tscale, dtype=np.float32), tend, f32(light),
            int(nesterov), f32(lr), f32(mu), bufv, _np(public), g, qmax, scheme == "int4",
            _np(new_theta), _np(new_buf) if new_buf is not None else np.zeros(0, dtype=f32),
            _np(new_public), scales, raw[2 * n_groups :], n,
        )  # fmt: skip
    sf = torch.from_numpy(scales)
    raw[: 2 * n_groups].view(np.int16)[:] = sf.to(torch.bfloat16).view(torch.int16).numpy()
    return bool(ok), _f32(top_bits), new_theta, new_buf, new_public, sf, body
