"""The codec's group-wise int kernels (core/codec.py), run one cache-sized chunk at a time:
each step's operands stay in the core's cache, so a frame costs about one pass over memory
instead of one per torch op. The values are those of the same ops on whole tensors."""

from __future__ import annotations

import torch

CHUNK = 1 << 16  # values per chunk


def _step(group: int) -> int:
    return max(1, CHUNK // (2 * group)) * 2 * group  # whole groups, an even count


def _spread(sf: torch.Tensor, s: int, k: int, group: int) -> torch.Tensor:
    """The scale of each of the values s..s+k (whole groups), one per value: a row-wise
    broadcast runs ~15x slower than this and a contiguous op on the CPU."""
    return torch.repeat_interleave(sf[s // group : (s + k) // group], group)


def group_absmax(g: torch.Tensor) -> torch.Tensor:
    """max |x| of each row of `g` (one row per group)."""
    rows = max(1, CHUNK // g.shape[1])
    out = torch.empty(g.shape[0])
    buf = torch.empty(rows, g.shape[1])
    for s in range(0, g.shape[0], rows):
        k = min(rows, g.shape[0] - s)
        torch.amax(torch.abs(g[s : s + k], out=buf[:k]), dim=1, out=out[s : s + k])
    return out


def quantize(
    g: torch.Tensor, sf: torch.Tensor, scheme: str, qmax: int, qb: torch.Tensor,
    sent: torch.Tensor | None,
) -> None:  # fmt: skip
    """Rows `g` (groups) quantized with float scales `sf` into the body bytes `qb` (int8, or
    int4: two values a byte, low nibble first, each + 8; an odd count padded with 8); `sent`
    (flat, the groups' values) gets what a decoder will read."""
    n_groups, group = g.shape
    flat = g.reshape(-1)
    n = flat.numel()
    step = _step(group)
    buf = torch.empty(step + 1)
    u = torch.empty(step + 1, dtype=torch.uint8)
    hi = torch.empty(step // 2 + 1, dtype=torch.uint8)
    for s in range(0, n, step):
        k = min(step, n - s)
        t = buf[:k]
        scale = _spread(sf.view(-1), s, k, group)
        torch.div(flat[s : s + k], scale, out=t)
        t.round_().clamp_(-qmax, qmax)
        if sent is not None:
            torch.mul(t, scale, out=sent[s : s + k])
        if scheme == "int8":
            qb[s : s + k].view(torch.int8).copy_(t)
            continue
        m = k + (k % 2)
        uu = u[:m]
        uu[:k].copy_(t.add_(8))
        if m > k:
            uu[k] = 8
        h = hi[: m // 2]
        torch.bitwise_left_shift(uu[1::2], 4, out=h)
        torch.bitwise_or(uu[0::2], h, out=qb[s // 2 : (s + m) // 2])


def dequantize(
    qb: torch.Tensor, sf: torch.Tensor, group: int, scheme: str, out: torch.Tensor,
    base: torch.Tensor | None = None,
) -> float:  # fmt: skip
    """out[i] = q[i] * scale of i's group, for the quantized body bytes `qb` (the inverse of
    `quantize`); `out` holds at least the groups' values.
    With `base` (flat, its values: the frame's numel): out[i] = base[i] - that value, and the
    sum of the squared values (float64) is returned (else 0)."""
    n = sf.numel() * group
    step = _step(group)
    nib = torch.empty(step + 1, dtype=torch.uint8)
    sq = 0.0
    for s in range(0, n, step):
        k = min(step, n - s)
        o = out[s : s + k]
        if scheme == "int4":  # (an odd count's last byte holds one value and a pad nibble)
            pair = nib[: k + (k % 2)].view(-1, 2)
            b = qb[s // 2 : (s + k + 1) // 2]
            torch.bitwise_and(b, 15, out=pair[:, 0])
            torch.bitwise_right_shift(b, 4, out=pair[:, 1])
            o.copy_(nib[:k]).sub_(8)
        else:
            o.copy_(qb[s : s + k].view(torch.int8))
        o.mul_(_spread(sf, s, k, group))
        if base is not None:
            kk = min(k, base.numel() - s)
            sq += float(torch.linalg.vector_norm(o[:kk], dtype=torch.float64)) ** 2
            torch.sub(base[s : s + kk], o[:kk], out=o[:kk])
    return sq
