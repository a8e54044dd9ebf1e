"""A contribution's frame taken in by the syncer: checked and unpacked (`unpack`: crc,
decompression, and for a frame to be held its values' measure, all without the protocol's
state, so that a driver runs it before it takes the lock), then decoded against its base or
held as it is (`decode_from`, core/fused.py's `Held`). The wire format is core/codec.py's."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from atoll.core import fused, held_figures, quant
from atoll.core.codec import (
    FLT_MAX,
    MAX_NUMEL,
    QBOUND,
    QMAX,
    CodecError,
    all_finite,
    checked_body,
    decode_body,
    scales_of,
)


@dataclass(frozen=True)
class Unpacked:
    """What decoding a frame needs no state for (`unpack`): its checked fields and body
    (decompressed), or the error that refuses it; to be held, the held body, its values' norm
    and largest |value| (`fused.hold`)."""

    scheme: str = ""
    numel: int = 0
    group: int = 1
    raw: torch.Tensor | None = None
    held: tuple[fused.Held, float, float] | None = None
    error: CodecError | None = None


def unpack(frame: bytes, numel: int, hold: Any = None) -> Unpacked:
    """A frame of `numel` values checked and unpacked (`decode_from`'s first part): reads no
    state, so a driver may run it on its own thread, before it takes the protocol's lock.
    `hold`: the fused kernels, to measure an int or bf16 body for holding it."""
    try:
        scheme, n, group, raw = checked_body(frame, numel, MAX_NUMEL)
        if hold is None or not n or scheme not in fused.HOLDABLE:
            return Unpacked(scheme, n, group, raw)
        sf, top = torch.zeros(0), 0.0
        body = raw
        if scheme != "bf16":
            n_groups, sf, scale = scales_of(raw, n, group)
            body, top = raw[2 * n_groups :], scale * QBOUND[scheme]
        held, sq, biggest = fused.hold(hold, scheme, n, group, body.numpy(), sf.numpy())
        top = max(top, biggest)
        if not (math.isfinite(top) and math.isfinite(sq)):  # (nan fails isfinite too)
            raise CodecError("payload holds non-finite values")
        return Unpacked(scheme, n, group, raw, (held, math.sqrt(sq), top))
    except CodecError as exc:
        return Unpacked(error=exc)


def decode_from(
    frame: bytes,
    base: torch.Tensor,
    out: torch.Tensor | None = None,
    hold: Any = None,
    unpacked: Unpacked | None = None,
) -> tuple[torch.Tensor | fused.Held, float, bool | None]:
    """(base - the frame's values, the norm of those values, whether base - values is all
    finite: None when not checked here), checked as `decode` checks; an int frame in one pass
    (its values are never whole in memory). `base`: flat float32; `out`: a float32 buffer to
    write into (used when it holds the frame's groups), else a new one: the values are then a
    view of that buffer. `hold`: the fused kernels (core/fused.py), to keep an int or bf16
    frame's body as it is (a `fused.Held`, decoded when its round closes) instead; whether
    base - values is finite then follows from the largest |base| and |value| (one exact pass
    when that bound fails). `unpacked`: the frame's `unpack` (with the same `hold`), if done."""
    u = unpacked if unpacked is not None else unpack(frame, base.numel(), hold)
    if u.error is not None:
        raise u.error
    if u.numel != base.numel():
        raise CodecError(f"frame holds {u.numel} values, expected {base.numel()}")
    if u.held is not None:
        held, norm, top = u.held
        held = dataclasses.replace(held, base=base)
        return held, norm, top + held_figures.absmax(base) <= FLT_MAX or all_finite(held.values())
    scheme, numel, group, raw = u.scheme, u.numel, u.group, u.raw
    assert raw is not None
    if scheme not in QMAX or numel == 0:  # (the body unpacked: not checked a second time)
        delta = decode_body(scheme, numel, group, raw)
        norm = float(torch.linalg.vector_norm(delta, dtype=torch.float64))
        return torch.sub(base, delta, out=delta), norm, None
    n_groups, sf, _top = scales_of(raw, numel, group)
    if out is None or out.numel() < n_groups * group:
        out = torch.empty(n_groups * group)
    sq = quant.dequantize(raw[2 * n_groups :], sf, group, scheme, out, base)
    norm = math.sqrt(sq)
    if not math.isfinite(norm):  # (a float64 sum of float32 squares cannot overflow)
        raise CodecError("payload holds non-finite values")
    return out[:numel], norm, None
