"""The syncer round's fused kernels (numba): each does in one pass over a block of values what
the reference path (core/quant.py, core/merge.py, core/outer.py, core/delivery.py) does in one
torch op per step, with the same float32 arithmetic in the same order, so that its values are
the reference's (its float64 sums are added in another order: the last bits of a norm may
differ, never the format).

Blocks are BLOCK values of one tensor, shared out over the threads (`prange`); a sum over a
fragment is one partial per block, added in block order afterwards: the result does not depend
on the thread count. Imported only by core/fused.py (numba is loaded when a round first
needs it)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

BLOCK = 1 << 14  # values of one block (its operands stay in the core's cache)
_F32_MAX = np.float32(3.4028234663852886e38)
_F32_TINY = np.float32(1.1754943508222875e-38)


@njit(cache=True, nogil=True, parallel=True)
def decode_sub(body, sf, group, int4, base, out, n):  # pragma: no cover - compiled
    """out[i] = base[i] - q[i] * sf[i // group] for the quantized body (int4: two values a
    byte, low nibble first, each + 8; int8: one signed byte). Per block of whole groups: the
    float64 sum of the decoded values' squares (what the magnitude guard reads), and whether
    every out[i] is finite."""
    n_groups = (n + group - 1) // group
    per = max(2, (BLOCK // group) // 2 * 2)
    nb = (n_groups + per - 1) // per
    part = np.zeros(nb)
    finite = np.ones(nb, dtype=np.bool_)
    for b in prange(nb):
        acc = 0.0
        fin = True  # every |out| <= the float32 maximum (NaN fails the comparison)
        for g in range(b * per, min((b + 1) * per, n_groups)):
            scale = sf[g]
            g0 = g * group
            g1 = min(g0 + group, n)
            if int4 and not (g0 | g1) & 1:  # whole bytes: two values each, no branch
                for j in range(g0 >> 1, g1 >> 1):
                    byte = body[j]
                    lo = (np.float32(byte & 15) - np.float32(8.0)) * scale
                    hi = (np.float32(byte >> 4) - np.float32(8.0)) * scale
                    acc += np.float64(lo) * np.float64(lo) + np.float64(hi) * np.float64(hi)
                    a = base[2 * j] - lo
                    c = base[2 * j + 1] - hi
                    out[2 * j] = a
                    out[2 * j + 1] = c
                    fin = fin & (abs(a) <= _F32_MAX) & (abs(c) <= _F32_MAX)
                continue
            for i in range(g0, g1):
                if int4:
                    q = np.float32((body[i >> 1] >> ((i & 1) * 4)) & 15) - np.float32(8.0)
                else:
                    x = np.int32(body[i])
                    q = np.float32(x - ((x >> 7) << 8))
                v = q * scale
                acc += np.float64(v) * np.float64(v)
                a = base[i] - v
                out[i] = a
                fin = fin & (abs(a) <= _F32_MAX)
        part[b] = acc
        finite[b] = fin
    return part, finite


@njit(cache=True, nogil=True, parallel=True)
def decode_sub_bf16(bits, base, out, out_bits, n):  # pragma: no cover - compiled
    """out[i] = base[i] - the bf16 value bits[i] (exactly its float32: the bits shifted up;
    `out_bits` is `out` viewed as uint32). Per block: the float64 sum of the values' squares,
    whether every value is finite, whether every out[i] is."""
    nb = (n + BLOCK - 1) // BLOCK
    part = np.zeros(nb)
    ok_in = np.ones(nb, dtype=np.bool_)
    ok_out = np.ones(nb, dtype=np.bool_)
    for b in prange(nb):
        acc = 0.0
        fin_in = True
        fin_out = True
        for i in range(b * BLOCK, min(b * BLOCK + BLOCK, n)):
            out_bits[i] = np.uint32(bits[i]) << np.uint32(16)
            v = out[i]
            acc += np.float64(v) * np.float64(v)
            a = base[i] - v
            out[i] = a
            fin_in = fin_in & (abs(v) <= _F32_MAX)
            fin_out = fin_out & (abs(a) <= _F32_MAX)
        part[b] = acc
        ok_in[b] = fin_in
        ok_out[b] = fin_out
    return part, ok_in, ok_out


@njit(cache=True, nogil=True, parallel=True)
def diff_squares(theta, values, bs, be):  # pragma: no cover - compiled
    """Per value vector m and block b: the float64 sum of (theta - values[m])^2 over the
    block's values (the difference in float32, as the reference takes it)."""
    m_count = len(values)
    part = np.zeros((m_count, len(bs)))
    for b in prange(len(bs)):
        for m in range(m_count):
            v = values[m]
            acc = 0.0
            for i in range(bs[b], be[b]):
                d = np.float64(theta[i] - v[i])
                acc += d * d
            part[m, b] = acc
    return part


@njit(cache=True, nogil=True, parallel=True)
def weighted_sum(theta, values, coef, bt, bs, be, out):  # pragma: no cover - compiled
    """out[i] = sum_m coef[m, t] * (theta[i] - values[m][i]) for the values of tensor t,
    summed in float64 in m order; per block, the float64 sum of the squares of those sums."""
    m_count = len(values)
    part = np.zeros(len(bs))
    for b in prange(len(bs)):
        t, s, e = bt[b], bs[b], be[b]
        acc = np.zeros(e - s)
        for m in range(m_count):
            c = coef[m, t]
            if c == 0.0:
                continue
            v = values[m]
            for i in range(s, e):
                acc[i - s] += c * np.float64(theta[i] - v[i])
        sq = 0.0
        for i in range(s, e):
            a = acc[i - s]
            sq += a * a
            out[i] = np.float32(a)
        part[b] = sq
    return part


@njit(cache=True, nogil=True)
def _bf16(x, box, bits):  # pragma: no cover - compiled
    """float32 `x` rounded to the nearest bfloat16 (ties to even), as a float32 (x finite);
    `box` (float32[1]) and `bits` (its uint32 view): scratch for the reinterpretation."""
    box[0] = x
    u = bits[0]
    bits[0] = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(
        0xFFFF0000
    )
    return box[0]


@njit(cache=True, nogil=True, parallel=True)
def step_encode(
    theta, delta, tscale, tend, light, kind, lr, mu, buf, public, group, qmax, int4,
    new_theta, new_buf, new_public, scales, body, n,
):  # pragma: no cover - compiled  # fmt: skip
    """The round's close after the merge, one pass per group of values:
        d = (delta * tscale[t]) * light                    (RDA's radius, the light round)
        sgd:      new_theta = theta - lr * d
        nesterov: new_buf = mu * buf + d;  new_theta = theta - lr * (d + mu * new_buf)
        change = new_theta - public, quantized group-wise (bf16 absmax scales, int4/int8 body)
        new_public = public + what a learner decodes
    (t: the tensor of the value, `tend` their ends). A block is an even number of whole groups
    (an int4 byte never spans two). Returns (every new value finite?, the largest |change|):
    the caller refuses the round on either; only the new_* arrays were written."""
    n_groups = (n + group - 1) // group
    per = max(2, (BLOCK // group) // 2 * 2)  # groups per block
    nb = (n_groups + per - 1) // per
    finite = np.ones(nb, dtype=np.bool_)
    top = np.zeros(nb, dtype=np.float32)
    for b in prange(nb):
        chg = np.empty(group, dtype=np.float32)
        box = np.empty(1, dtype=np.float32)
        bits = box.view(np.uint32)
        first = b * per * group
        t = np.searchsorted(tend, first, side="right")
        for gi in range(b * per, min((b + 1) * per, n_groups)):
            g0 = gi * group
            g1 = min(g0 + group, n)
            amax = np.float32(0.0)
            for i in range(g0, g1):
                while i >= tend[t]:
                    t += 1
                d = delta[i] * tscale[t]
                if light != np.float32(1.0):
                    d = d * light
                if kind == 0:
                    nt = theta[i] - lr * d
                else:
                    mb = mu * buf[i] + d
                    new_buf[i] = mb
                    nt = theta[i] - lr * (d + mu * mb)
                if not (abs(nt) <= _F32_MAX):
                    finite[b] = False
                new_theta[i] = nt
                c = nt - public[i]
                chg[i - g0] = c
                if abs(c) > amax:
                    amax = abs(c)
            if amax > top[b]:
                top[b] = amax
            if amax < np.float32(qmax) * _F32_TINY or not (amax <= _F32_MAX):
                sc = np.float32(1.0)
            else:
                sc = _bf16((amax / np.float32(qmax)) * np.float32(1.0 + 2.0**-7), box, bits)
            scales[gi] = sc
            if int4 and g1 == g0 + group and not (g0 | group) & 1:  # whole bytes, no branch
                lim = np.float32(qmax)
                for j in range(g0 >> 1, g1 >> 1):
                    i = 2 * j
                    r0 = min(max(np.float32(np.rint(chg[i - g0] / sc)), -lim), lim)
                    r1 = min(max(np.float32(np.rint(chg[i + 1 - g0] / sc)), -lim), lim)
                    new_public[i] = public[i] + r0 * sc
                    new_public[i + 1] = public[i + 1] + r1 * sc
                    body[j] = np.uint8(np.int32(r0) + 8) | (
                        np.uint8(np.int32(r1) + 8) << np.uint8(4)
                    )
                continue
            for i in range(g0, g0 + group):
                c = chg[i - g0] if i < g1 else np.float32(0.0)
                r = min(max(np.float32(np.rint(c / sc)), np.float32(-qmax)), np.float32(qmax))
                if i < g1:
                    new_public[i] = public[i] + r * sc
                if int4:
                    nib = np.uint8(np.int32(r) + 8)
                    if i & 1:
                        body[i >> 1] = body[i >> 1] | (nib << np.uint8(4))
                    else:
                        body[i >> 1] = nib
                else:
                    x = np.int32(r)
                    body[i] = np.uint8(x + 256 if x < 0 else x)
    return finite.all(), top.max() if nb else np.float32(0.0)
