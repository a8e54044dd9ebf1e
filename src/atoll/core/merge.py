"""Merging learners' outer gradients for one fragment.

- weighted mean:  sum_m w_m v_m / sum_m w_m
- RDA (radial-directional averaging), per tensor:
      (sum w_m |v_m| / sum w_m) * normalize(sum w_m v_m / |v_m|),   normalize(0) = 0
  The norm of the result is the weighted mean of the input norms, so merging M nearly
  orthogonal outer gradients does not shrink the step by sqrt(M).
Embedding tensors always use the weighted mean.

A light round (`light_rounds="scale"`, the default) moves Theta in proportion to the work it
carries: the merged delta is scaled by min(1, W / W_p), W the round's summed token weight and
W_p the average of fragment p's recent rounds (`RoundWeight`). Learners absent from a round
count as agreeing with Theta, and the weights still set the mix within the round. Without it
(`"full"`, the paper's rule) one learner alone replaces a fragment with its own value: a lone
final flush of one step, from a learner just restarted on a fresh inner optimizer and one or
two versions behind, undid the others' work (BENCHMARKS.md, peer benchmark (e)). A first
form counted learners instead of weight, over all fragments at once: within a burst of 24
such rounds its average fell towards 1 and the last ones moved Theta by 0.9 of their delta.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from atoll.core.choices import MERGES
from atoll.errors import ConfigError


class RoundWeight:
    """Per fragment, the usual summed weight of its rounds (an average over its last ~1/decay
    rounds), and how far a round of summed weight `total` moves Theta against it."""

    def __init__(self, P: int, mode: str = "scale", decay: float = 0.2) -> None:
        self.mode, self.decay = mode, decay  # mode: checked by SyncerConfig.validate
        self.usual: list[float | None] = [None] * P

    def scale(self, p: int, total: float) -> float:
        """The factor for fragment p's round of summed weight `total`."""
        usual = self.usual[p]
        if self.mode == "full" or usual is None or usual <= 0 or total >= usual:
            return 1.0
        return max(total, 0.0) / usual

    def committed(self, p: int, total: float) -> None:
        """Fragment p's round of summed weight `total` was merged: it joins the average."""
        usual = self.usual[p]
        self.usual[p] = total if usual is None else (1 - self.decay) * usual + self.decay * total

    def state(self) -> dict[str, float | None]:
        return {f"round_weight.{p}": v for p, v in enumerate(self.usual)}

    def load(self, st: dict[str, float | None]) -> None:
        self.usual = [st.get(f"round_weight.{p}") for p in range(len(self.usual))]


def normalized(vectors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    if len(vectors) == 0 or len(vectors) != len(weights):
        raise ValueError(f"need one weight per vector, got {len(vectors)} and {len(weights)}")
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if (w < 0).any() or not torch.isfinite(w).all():
        raise ValueError(f"weights must be finite and >= 0, got {list(weights)}")
    if w.sum() <= 0:  # all-zero weights: treat everyone equally
        w = torch.ones_like(w)
    return (w / w.sum()).tolist()


def weighted_mean(vectors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    w = normalized(vectors, weights)
    out = torch.zeros_like(vectors[0], dtype=torch.float64)
    for v, wi in zip(vectors, w, strict=True):
        out += wi * v.double()
    return out.to(vectors[0].dtype)


def rda(vectors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    w = normalized(vectors, weights)
    radius = 0.0
    direction = torch.zeros_like(vectors[0], dtype=torch.float64)
    for v, wi in zip(vectors, w, strict=True):
        vd = v.double()
        n = float(vd.norm())
        radius += wi * n
        if n > 0:
            direction += wi * vd / n
    dn = float(direction.norm())
    if dn == 0.0:
        return torch.zeros_like(vectors[0])
    return (radius * direction / dn).to(vectors[0].dtype)


def merge_fragment(
    deltas: Sequence[list[torch.Tensor]],
    weights: Sequence[float],
    is_embedding: bool,
    method: str = "rda",
) -> list[torch.Tensor]:
    """Merge per-tensor outer gradients of several learners (each a list of tensors)."""
    if method not in MERGES:
        raise ConfigError("merge", method, f"one of {MERGES}")
    fn = weighted_mean if (is_embedding or method == "mean") else rda
    return [fn([d[i] for d in deltas], weights) for i in range(len(deltas[0]))]


_CHUNK = 1 << 16  # values of one tensor merged at a time (the accumulator stays in cache)
CANCELLED = 1e-10  # RDA: a direction this short is opposite outer gradients cancelling


def merge_flat(
    theta: torch.Tensor,
    values: Sequence[torch.Tensor],
    weights: Sequence[float],
    sizes: Sequence[int],
    mean: bool,
    chunk: int = _CHUNK,
) -> torch.Tensor:
    """`merge_fragment` of the outer gradients theta - values[m] of one flat fragment whose
    tensors have `sizes` values each, as one flat float32 vector, streamed: no outer
    gradient is materialized whole; each tensor is read in cache-sized chunks (twice for
    RDA: once for the norms, once for the weighted sum) and accumulated in float64.
    Equal to `merge_fragment` within float rounding (tests/unit/test_merge_stream.py)."""
    w = normalized(values, weights)
    out = torch.empty_like(theta, dtype=torch.float32)
    d = torch.empty(chunk)
    acc = torch.empty(chunk, dtype=torch.float64)
    start = 0
    for size in sizes:
        end = start + size
        if mean:
            _weighted_sum(theta, values, w, start, end, d, acc, out)
        else:
            _rda(theta, values, w, start, end, d, acc, out)
        start = end
    return out


def _weighted_sum(theta, values, coef, start, end, d, acc, out) -> float:
    """out[start:end] = sum_m coef[m] (theta - values[m]) (float64 sums); its squared norm."""
    sq = 0.0
    for s in range(start, end, d.numel()):
        k = min(d.numel(), end - s)
        a = acc[:k].zero_()
        for v, c in zip(values, coef, strict=True):
            if c:
                a.add_(torch.sub(theta[s : s + k], v[s : s + k], out=d[:k]), alpha=c)
        sq += float(a.dot(a))
        out[s : s + k].copy_(a)
    return sq


def _rda(theta, values, w, start, end, d, acc, out) -> None:
    sq = [0.0] * len(values)
    for s in range(start, end, d.numel()):  # theta's chunk is read once for all M
        k = min(d.numel(), end - s)
        for i, v in enumerate(values):
            x = torch.sub(theta[s : s + k], v[s : s + k], out=d[:k])
            sq[i] += float(torch.linalg.vector_norm(x, dtype=torch.float64)) ** 2
    norms = [q**0.5 for q in sq]
    radius = sum(wi * n for wi, n in zip(w, norms, strict=True))
    coef = [wi / n if n > 0 else 0.0 for wi, n in zip(w, norms, strict=True)]
    dn = _weighted_sum(theta, values, coef, start, end, d, acc, out) ** 0.5
    seg = out[start:end]
    # directions that cancel: dn is at most the weight of the non-zero outer gradients (their
    # unit vectors' weights), and a float64 residue of ~1e-16 of it from summing in another
    # order is 0 in the reference too; relative to that weight, not to 1, so that one lightly
    # weighted outer gradient beside zero ones is not taken for a cancellation
    live = sum(wi for wi, n in zip(w, norms, strict=True) if n > 0)
    if dn <= CANCELLED * live:
        seg.zero_()
    else:
        seg.mul_(radius / dn)
