"""The syncer round's fused data path: numba kernels (core/fused_kernels.py) that decode a
contribution, merge a round and close it (outer step, broadcast encode with its error carried
in the public value) in one pass per cache-sized block each, on `syncer_threads` threads.

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

import importlib
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import torch

from atoll.errors import ConfigError

FUSED_MODES = ("auto", "on", "off")
MIN_VALUES = 1 << 18
log = logging.getLogger("atoll.syncer")

_lock = threading.Lock()  # one kernel at a time (numba's default thread pool is not reentrant)
_mode = {"fused": "auto", "threads": 0}
_loaded: dict[str, Any] = {}


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check(fused: str, threads: str) -> int:
    """The settings checked: the thread count `threads` ("auto": every core the process may
    use) resolved."""
    if fused not in FUSED_MODES:
        raise ConfigError("fused", fused, f"one of {', '.join(FUSED_MODES)}")
    n = cores()
    if threads == "auto":
        return n
    try:
        k = int(threads)
    except ValueError:
        k = 0
    if not 1 <= k <= n:
        raise ConfigError(
            "syncer_threads", threads, f"auto or an integer in [1, {n}] (the cores it may use)"
        )
    return k


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
    import numpy as np

    f = np.zeros(4, dtype=np.float32)
    k.decode_sub(np.zeros(2, dtype=np.uint8), np.ones(1, dtype=np.float32), 4, True, f, f, 4)
    g = f.copy()
    k.decode_sub_bf16(np.zeros(4, dtype=np.uint16), f, g, g.view(np.uint32), 4)
    from numba.typed import List

    vals = List([f])
    b = np.zeros(1, dtype=np.int64)
    k.diff_squares(f, vals, b, b + 4)
    k.weighted_sum(f, vals, np.ones((1, 1)), b, b, b + 4, f.copy())
    k.step_encode(f, f, np.ones(1, dtype=np.float32), b + 4, np.float32(1), 0, np.float32(1),
                  np.float32(0.9), f, f, 4, 7, True, f.copy(), f.copy(), f.copy(),
                  np.ones(1, dtype=np.float32), np.zeros(2, dtype=np.uint8), 4)  # fmt: skip


def _np(t: torch.Tensor) -> Any:
    return t.detach().numpy()


def decode_sub(
    k: Any, body: torch.Tensor, sf: torch.Tensor, group: int, scheme: str,
    base: torch.Tensor, out: torch.Tensor,
) -> tuple[float, bool]:  # fmt: skip
    """out[:n] = base - the body's values (n = base.numel()): (the sum of the values'
    squares, whether every out value is finite)."""
    n = base.numel()
    with _lock:
        part, finite = k.decode_sub(_np(body), _np(sf), group, scheme == "int4", _np(base),
                                    _np(out), n)  # fmt: skip
    return float(part.sum()), bool(finite.all())  # the blocks' partials, in block order


def decode_sub_bf16(
    k: Any, raw: torch.Tensor, base: torch.Tensor, out: torch.Tensor
) -> tuple[float, bool, bool]:
    """out[:n] = base - the bf16 body's values: (the sum of the values' squares, whether
    every value is finite, whether every out value is)."""
    n = base.numel()
    o = _np(out)
    with _lock:
        part, ok_in, ok_out = k.decode_sub_bf16(_np(raw.view(torch.int16)).view("uint16"),
                                                _np(base), o, o.view("uint32"), n)  # fmt: skip
    return float(part.sum()), bool(ok_in.all()), bool(ok_out.all())


def _blocks(k: Any, sizes: Sequence[int]) -> tuple[Any, Any, Any]:
    """(tensor, start, end) of each block: k.BLOCK values at most, never across a tensor."""
    import numpy as np

    bt, bs, be = [], [], []
    start = 0
    for t, size in enumerate(sizes):
        for s in range(start, start + size, k.BLOCK):
            bt.append(t)
            bs.append(s)
            be.append(min(s + k.BLOCK, start + size))
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
    k: Any, theta: torch.Tensor, values: Sequence[torch.Tensor], w: Sequence[float],
    sizes: Sequence[int], mean: bool, cancelled: float,
) -> tuple[torch.Tensor, list[float]]:  # fmt: skip
    """`merge.merge_flat` before its last step: (sum_m c[m,t] (theta - values[m]) as float32,
    the factor of each tensor t to multiply it by). `w`: the normalized weights."""
    import numpy as np
    from numba.typed import List

    bt, bs, be = _blocks(k, sizes)
    m_count, t_count = len(values), len(sizes)
    th = _np(theta)
    out = torch.empty(theta.numel(), dtype=torch.float32)
    vals = List([_np(v) for v in values])

    def sums(coef: Any) -> Any:
        return k.weighted_sum(th, vals, coef, bt, bs, be, _np(out))

    with _lock:
        if mean:
            sums(np.repeat(np.asarray(w, dtype=np.float64)[:, None], t_count, axis=1))
            return out, [1.0] * t_count
        sq = k.diff_squares(th, vals, bs, be)
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
) -> tuple[bool, float, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, bytes]:
    """The close after the merge (fused_kernels.step_encode): (all finite, the largest
    |change|, new theta, new momentum buffer or None, new public value, the bf16 scales,
    the frame's body before compression)."""
    import numpy as np

    n = theta.numel()
    g = max(1, min(group, n))
    n_groups = -(-n // g)
    padded = n_groups * g
    body = bytearray(2 * n_groups + (padded if scheme == "int8" else -(-padded // 2)))
    raw = np.frombuffer(body, dtype=np.uint8)
    scales = np.empty(n_groups, dtype=np.float32)
    new_theta, new_public = torch.empty(n), torch.empty(n)
    nesterov = kind == "nesterov"
    new_buf = torch.empty(n) if nesterov else None
    bufv = _np(buf) if nesterov and buf is not None else np.zeros(0 if not nesterov else n,
                                                                   dtype=np.float32)  # fmt: skip
    tend = np.cumsum(np.asarray(sizes, dtype=np.int64))
    f32 = np.float32
    with _lock:
        ok, top = k.step_encode(
            _np(theta), _np(delta), np.asarray(tscale, dtype=np.float32), tend, f32(light),
            int(nesterov), f32(lr), f32(mu), bufv, _np(public), g, qmax, scheme == "int4",
            _np(new_theta), _np(new_buf) if new_buf is not None else np.zeros(0, dtype=f32),
            _np(new_public), scales, raw[2 * n_groups :], n,
        )  # fmt: skip
    if scheme == "int4" and padded % 2:  # an odd count's last byte: its pad nibble is 8
        raw[-1] |= 0x80
    sf = torch.from_numpy(scales)
    raw[: 2 * n_groups].view(np.int16)[:] = sf.to(torch.bfloat16).view(torch.int16).numpy()
    return bool(ok), float(top), new_theta, new_buf, new_public, sf, bytes(body)
