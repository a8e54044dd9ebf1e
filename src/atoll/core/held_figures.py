"""Figures of a tensor the protocol holds unchanged (a fragment's public value of one version,
the base of the contributions made on it): computed once, not once per contribution, while
the same tensor is held and unwritten (its identity and torch's version counter)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

_cache: dict[tuple[int, str], tuple[Any, int, float]] = {}
_lock = threading.Lock()
LIMIT = 256


def figure(t: torch.Tensor, name: str, fn: Callable[[torch.Tensor], float]) -> float:
    """fn(t), cached under `name` for this tensor while it is unchanged."""
    key = (id(t), name)
    with _lock:
        hit = _cache.get(key)
    if hit is not None and hit[0]() is t and hit[1] == t._version:
        return hit[2]
    value = float(fn(t))
    with _lock:
        if len(_cache) >= LIMIT:
            _cache.clear()
        _cache[key] = (weakref.ref(t), t._version, value)
    return value


def absmax(t: torch.Tensor) -> float:
    """max |t| (0 for an empty tensor)."""

    def amax(x: torch.Tensor) -> float:
        if not x.numel():
            return 0.0
        lo, hi = torch.aminmax(x)
        return max(-float(lo), float(hi))

    return figure(t, "absmax", amax)


def norm(t: torch.Tensor) -> float:
    """The L2 norm of t."""
    return figure(t, "norm", lambda x: float(torch.linalg.vector_norm(x)))
