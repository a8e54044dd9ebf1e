"""What a family is, and the byte mutations every family shares."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hypothesis import strategies as st

# numbers that break decoders: edges of every integer width, and the floats that are not
INTS = (
    0,
    1,
    2,
    7,
    8,
    63,
    64,
    65,
    255,
    256,
    2**15,
    2**16,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    -1,
    -2,
    -(2**31),
    -(2**63),
)
FLOATS = (
    0.0,
    -0.0,
    1e-45,
    1e-300,
    0.5,
    1.0,
    3.0e38,
    3.5e38,
    1e300,
    -1.0,
    -1e300,
    float("inf"),
    float("-inf"),
    float("nan"),
)


class Violation(AssertionError):
    """A property of a decoder is broken (not a crash of its own: the check found it);
    `owner`: the module at fault when it is not the family's reader (e.g. a setting that the
    reader typed correctly but the settings' validation let through)."""

    def __init__(self, message: str, owner: str | None = None) -> None:
        super().__init__(message)
        self.owner = owner


@dataclass(frozen=True)
class Family:
    name: str
    cases: st.SearchStrategy
    check: Callable[[Any], str]  # "refused" or "accepted"; raises Violation or crashes
    refusal: str  # what counts as a clear refusal
    bound: Callable[[Any], int]  # bytes one case may allocate (traced by tracemalloc)


def interesting_int(lo: int | None = None, hi: int | None = None) -> st.SearchStrategy[int]:
    edges = [v for v in INTS if (lo is None or v >= lo) and (hi is None or v <= hi)]
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def interesting_float() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(FLOATS), st.floats(allow_nan=True, allow_infinity=True))


# -- byte mutations: ("op", args...), applied in order; positions wrap around the data --------
MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.integers(1, 64)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("repeat"), st.integers(0, 1 << 20), st.integers(1, 64)),
)
MUTATIONS = st.lists(MUTATION, min_size=1, max_size=4)


def mutate(data: bytes, ops: list[tuple]) -> bytes:
    b = bytearray(data)
    for op in ops:
        kind, args = op[0], op[1:]
        n = len(b)
        if kind == "flip" and n:
            b[args[0] % n] ^= 1 << args[1]
        elif kind == "set" and n:
            b[args[0] % n] = args[1]
        elif kind == "truncate":
            del b[args[0] % (n + 1) :]
        elif kind == "insert":
            i = args[0] % (n + 1)
            b[i:i] = args[1]
        elif kind == "delete" and n:
            i = args[0] % n
            del b[i : i + args[1]]
        elif kind == "append":
            b += args[0]
        elif kind == "repeat" and n:
            i = args[0] % n
            b[i:i] = b[i : i + args[1]]
    return bytes(b)


def tensor_bytes(t: torch.Tensor | None) -> tuple | None:
    """A tensor as (dtype, shape, raw bytes): equal exactly when bit-identical (NaN included)."""
    if t is None:
        return None
    t = t.detach().contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return (str(t.dtype), tuple(t.shape), raw)


def frozen(x: Any) -> Any:
    """A nested structure of dicts, lists and tensors as comparable plain values."""
    if isinstance(x, torch.Tensor):
        return tensor_bytes(x)
    if isinstance(x, dict):
        return tuple(sorted((repr(k), frozen(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(frozen(v) for v in x)
    if isinstance(x, float) and x != x:
        return ("nan",)
    return x


def first_difference(a: Any, b: Any, path: str = "") -> str:
    """Where two `frozen` values differ (for the message of a Violation)."""
    if type(a) is not type(b) or not isinstance(a, tuple) or len(a) != len(b):
        return path or "<top>"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return first_difference(x, y, f"{path}[{i}]")
    return path or "<top>"


def mostly(real: st.SearchStrategy, wild: st.SearchStrategy, share: int = 3) -> st.SearchStrategy:
    """`real` values `share` times in `share + 1` (hypothesis' one_of picks its branches evenly,
    and merges equal ones): the deeper checks only see inputs that pass the first ones."""
    return st.tuples(st.integers(0, share), real, wild).map(lambda t: t[1] if t[0] else t[2])


@functools.cache
def _scratch_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="atoll-fuzz-"))
    atexit.register(shutil.rmtree, root, True)
    return root


def scratch() -> Path:
    """An empty directory for one case, the same path every time: a new random name per case
    would grow the interpreter's table of interned strings (pathlib interns path parts), whose
    resizes tracemalloc would charge to some case."""
    root = _scratch_root() / "case"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir()
    return root
