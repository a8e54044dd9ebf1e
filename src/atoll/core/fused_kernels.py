"""The syncer round's fused kernels (numba): each does in one pass over a block of values what
the reference path (core/quant.py, core/merge.py, core/outer.py, core/delivery.py) does in one
torch op per step, with the same float32 arithmetic in the same order, so that its values are
the reference's (its float64 sums are added in another order: the last bits of a norm may
differ, never the format).

A contribution is held as its frame's body (core/fused.py, `Held`) and decoded, a block at a
time, where the close reads it: its values base - q * sf are never whole in memory.

Blocks are BLOCK values of one tensor (or whole groups, for the close), shared out over the
threads (`prange`); a sum over a fragment is one partial per block, added in block order
afterwards, and a block's sum is a fixed pairwise tree (`_fold`): the result depends neither on
the thread count nor on the machine's vector width.

Loops index from 0 over slices: numba checks a possibly negative index for wraparound, and that
check alone keeps LLVM from vectorizing a loop (about 5x slower). Imported only by
core/fused.py (numba is loaded when a round first needs it)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

BLOCK = 1 << 14  # values of one block (its operands stay in the core's cache)
INT8, INT4, BF16 = 0, 1, 2  # a held body's scheme
LANES = 16  # a fold stops at this many partial sums, added in order
_F32_MAX = np.float32(3.4028234663852886e38)
_F32_TINY = np.float32(1.1754943508222875e-38)
_ABS = np.uint32(0x7FFFFFFF)


@njit(cache=True, nogil=True, inline="always")
def _fold(x, k):  # pragma: no cover - compiled
    """The sum of x[:k] (float64, overwritten) by a fixed pairwise tree."""
    while k > LANES:
        h = (k + 1) // 2
        lo = x[: k - h]
        hi = x[h:k]
        for i in range(k - h):
            lo[i] += hi[i]
        k = h
    s = 0.0
    for i in range(k):
        s += x[i]
    return s


@njit(cache=True, nogil=True, parallel=True)
def body_squares(body, sf, group, scheme, n):  # pragma: no cover - compiled
    """Per block: the float64 sum of the squares of the body's n values, and the largest
    |value| bits (float32 as uint32; above 0x7F800000: not finite). int4/int8: q * sf, exact in
    float32, summed per group as sf^2 times the integer sum of q^2; bf16: the values."""
    if scheme == BF16:
        nb = (n + BLOCK - 1) // BLOCK
        part = np.zeros(nb)
        top = np.zeros(nb, dtype=np.uint32)
        b16 = body.view(np.uint16)
        for b in prange(nb):
            s = b * BLOCK
            k = min(BLOCK, n - s)
            x = b16[s : s + k]
            sq = np.empty(k)
            box = np.empty(1, dtype=np.uint32)
            f = box.view(np.float32)
            m = np.uint32(0)
            for i in range(k):
                u = np.uint32(x[i]) << np.uint32(16)
                m = max(m, u & _ABS)
                box[0] = u
                v = np.float64(f[0])
                sq[i] = v * v
            part[b] = _fold(sq, k)
            top[b] = m
        return part, top
    n_groups = (n + group - 1) // group
    per = max(1, BLOCK // group)
    nb = (n_groups + per - 1) // per
    part = np.zeros(nb)
    for b in prange(nb):
        acc = 0.0
        for g in range(b * per, min((b + 1) * per, n_groups)):
            g0 = g * group
            k = min(group, n - g0)
            s = 0
            if scheme == INT4 and not (g0 | k) & 1:
                bb = body[g0 >> 1 : (g0 + k) >> 1]
                for j in range(k >> 1):
                    x = np.int32(bb[j])
                    lo = (x & 15) - 8
                    hi = (x >> 4) - 8
                    s += lo * lo + hi * hi
            elif scheme == INT4:
                for i in range(g0, g0 + k):
                    q = np.int32((body[i >> 1] >> ((i & 1) << 2)) & 15) - 8
                    s += q * q
            else:
                bb = body[g0 : g0 + k]
                for j in range(k):
                    x = np.int32(bb[j])
                    q = x - ((x >> 7) << 8)
                    s += q * q
            f = np.float64(sf[g])
            acc += f * f * np.float64(s)
        part[b] = acc
    return part, np.zeros(nb, dtype=np.uint32)


@njit(cache=True, nogil=True, inline="always")
def _decode(body, sf, group, scheme, s, e, dec):  # pragma: no cover - compiled
    """The values s..e-1 of a body, in dec[o : o + e - s]: returns o (whole groups are
    decoded, from the group of value s; dec holds e - s + 2 * group values)."""
    if scheme == BF16:
        b16 = body.view(np.uint16)[s:e]
        d32 = dec.view(np.uint32)
        for i in range(e - s):
            d32[i] = np.uint32(b16[i]) << np.uint32(16)
        return 0
    g0 = s // group
    g1 = (e + group - 1) // group
    for g in range(g1 - g0):
        sc = sf[g0 + g]
        first = (g0 + g) * group
        d = dec[g * group : (g + 1) * group]
        if scheme == INT4 and not (first | group) & 1:
            bb = body[first >> 1 : (first + group) >> 1]
            for j in range(group >> 1):
                x = np.int32(bb[j])
                d[2 * j] = np.float32((x & 15) - 8) * sc
                d[2 * j + 1] = np.float32((x >> 4) - 8) * sc
        elif scheme == INT4:
            for j in range(group):
                i = first + j
                d[j] = np.float32(np.int32((body[i >> 1] >> ((i & 1) << 2)) & 15) - 8) * sc
        else:
            bb = body[first : first + group]
            for j in range(group):
                x = np.int32(bb[j])
                d[j] = np.float32(x - ((x >> 7) << 8)) * sc
    return s - g0 * group


@njit(cache=True, nogil=True, parallel=True)
def held_squares(theta, bodies, sfs, groups, scheme, bases, bs, be):  # pragma: no cover
    """Per held contribution m and block b: the float64 sum over the block's values of
    (theta - theta_m)^2, theta_m = bases[m] - the body's values (differences in float32, as
    the reference takes them)."""
    m_count = len(bodies)
    part = np.zeros((m_count, len(bs)))
    for b in prange(len(bs)):
        s, e = bs[b], be[b]
        k = e - s
        th = theta[s:e]
        dec = np.empty(k + 2 * groups.max(), dtype=np.float32)
        sq = np.empty(k)
        for m in range(m_count):
            o = _decode(bodies[m], sfs[m], groups[m], scheme, s, e, dec)
            v = dec[o : o + k]
            bm = bases[m][s:e]
            for i in range(k):
                x = np.float64(th[i] - (bm[i] - v[i]))
                sq[i] = x * x
            part[m, b] = _fold(sq, k)
    return part


@njit(cache=True, nogil=True, parallel=True)
def held_sum(theta, bodies, sfs, groups, scheme, bases, coef, bt, bs, be, out):  # pragma: no cover
    """out = sum_m coef[m, t] * (theta - theta_m) over the values of tensor t, summed in
    float64 in m order, as float32; per block, the float64 sum of the squares of those sums."""
    m_count = len(bodies)
    part = np.zeros(len(bs))
    for b in prange(len(bs)):
        t, s, e = bt[b], bs[b], be[b]
        k = e - s
        th = theta[s:e]
        acc = np.zeros(k)
        dec = np.empty(k + 2 * groups.max(), dtype=np.float32)
        for m in range(m_count):
            c = coef[m, t]
            if c == 0.0:
                continue
            o = _decode(bodies[m], sfs[m], groups[m], scheme, s, e, dec)
            v = dec[o : o + k]
            bm = bases[m][s:e]
            for i in range(k):
                acc[i] += c * np.float64(th[i] - (bm[i] - v[i]))
        ob = out[s:e]
        for i in range(k):
            a = acc[i]
            ob[i] = np.float32(a)
            acc[i] = a * a
        part[b] = _fold(acc, k)
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


@njit(cache=True, nogil=True, inline="always")
def _step(theta, delta, public, buf, new_theta, new_buf, chg, ts, light, kind, lr, mu):  # noqa: E501  # pragma: no cover
    """One tensor's slice of the outer step; chg = new theta - public. Returns all finite."""
    fin = True
    if kind == 0:
        for i in range(theta.size):
            nt = theta[i] - lr * ((delta[i] * ts) * light)
            new_theta[i] = nt
            fin = fin & (abs(nt) <= _F32_MAX)
            chg[i] = nt - public[i]
        return fin
    for i in range(theta.size):
        d = (delta[i] * ts) * light
        mb = mu * buf[i] + d
        new_buf[i] = mb
        nt = theta[i] - lr * (d + mu * mb)
        new_theta[i] = nt
        fin = fin & (abs(nt) <= _F32_MAX)
        chg[i] = nt - public[i]
    return fin


@njit(cache=True, nogil=True, parallel=True)
def step_encode(
    theta, delta, tscale, tend, light, kind, lr, mu, buf, public, group, qmax, int4,
    new_theta, new_buf, new_public, scales, body, n,
):  # pragma: no cover - compiled  # fmt: skip
    """The round's close after the merge, per block of whole groups:
        d = (delta * tscale[t]) * light                    (RDA's radius, the light round)
        sgd:      new_theta = theta - lr * d
        nesterov: new_buf = mu * buf + d;  new_theta = theta - lr * (d + mu * new_buf)
        change = new_theta - public, quantized group-wise (bf16 absmax scales, int4/int8 body)
        new_public = public + what a learner decodes
    (t: the tensor of the value, `tend` their ends; a factor of 1 changes no value). A block
    is an even number of whole groups (an int4 byte never spans two). Returns (every new value
    finite?, the largest |change|): the caller refuses the round on either; only the new_*
    arrays were written."""
    n_groups = (n + group - 1) // group
    per = max(2, (BLOCK // group) // 2 * 2)  # groups per block
    nb = (n_groups + per - 1) // per
    finite = np.ones(nb, dtype=np.bool_)
    top = np.zeros(nb, dtype=np.uint32)
    lim = np.float32(qmax)
    for b in prange(nb):
        span = per * group
        chg = np.zeros(span, dtype=np.float32)
        cbits = chg.view(np.uint32)
        scv = np.empty(span, dtype=np.float32)
        box = np.empty(1, dtype=np.float32)
        bits = box.view(np.uint32)
        first = b * span
        last = min(first + span, n)
        t = np.searchsorted(tend, first, side="right")
        i0 = first
        fin = True
        while i0 < last:  # the block's values, a tensor at a time
            i1 = min(last, tend[t])
            fin = fin & _step(
                theta[i0:i1], delta[i0:i1], public[i0:i1], buf[i0:i1], new_theta[i0:i1],
                new_buf[i0:i1], chg[i0 - first : i1 - first], tscale[t], light, kind, lr, mu,
            )  # fmt: skip
            i0 = i1
            t += 1
        finite[b] = fin
        g_first = b * per
        g_count = min((b + 1) * per, n_groups) - g_first
        tb = np.uint32(0)
        for g in range(g_count):  # each group's absmax scale
            cg = cbits[g * group : (g + 1) * group]
            m = np.uint32(0)
            for i in range(group):
                m = max(m, cg[i] & _ABS)
            tb = max(tb, m)
            bits[0] = m
            amax = box[0]
            if amax < lim * _F32_TINY or not (amax <= _F32_MAX):
                sc = np.float32(1.0)
            else:
                sc = _bf16((amax / lim) * np.float32(1.0 + 2.0**-7), box, bits)
            scales[g_first + g] = sc
            sg = scv[g * group : (g + 1) * group]
            for i in range(group):
                sg[i] = sc
        top[b] = tb
        used = g_count * group
        for i in range(used):  # the codes, in place of the changes
            chg[i] = min(max(np.float32(np.rint(chg[i] / scv[i])), -lim), lim)
        pub = public[first:last]
        npub = new_public[first:last]
        for i in range(last - first):
            npub[i] = pub[i] + chg[i] * scv[i]
        if int4:  # two codes a byte, low first, each + 8 (the padding's code is 0)
            bb = body[first >> 1 : (first + used + 1) >> 1]
            for j in range((used + 1) >> 1):
                lo = np.int32(chg[2 * j]) + 8
                hi = np.int32(chg[2 * j + 1]) + 8
                bb[j] = np.uint8(lo | (hi << 4))
        else:
            bb = body[first : first + used]
            for i in range(used):
                bb[i] = np.uint8(np.int32(chg[i]) & 255)
    return finite.all(), top.max() if nb else np.uint32(0)
