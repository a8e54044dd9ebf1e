"""Merging learners' outer gradients for one fragment.

- weighted mean:  sum_m w_m v_m / sum_m w_m
- RDA (radial-directional averaging), per tensor:
      (sum w_m |v_m| / sum w_m) * normalize(sum w_m v_m / |v_m|),   normalize(0) = 0
  The norm of the result is the weighted mean of the input norms, so merging M nearly
  orthogonal outer gradients does not shrink the step by sqrt(M).
Embedding tensors always use the weighted mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from atoll.errors import ConfigError

MERGES = ("rda", "mean")


def _check(vectors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    if len(vectors) == 0 or len(vectors) != len(weights):
        raise ValueError(f"need one weight per vector, got {len(vectors)} and {len(weights)}")
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if (w < 0).any() or not torch.isfinite(w).all():
        raise ValueError(f"weights must be finite and >= 0, got {list(weights)}")
    if w.sum() <= 0:  # all-zero weights: treat everyone equally
        w = torch.ones_like(w)
    return w / w.sum()


def weighted_mean(vectors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    w = _check(vectors, weights)
    out = torch.zeros_like(vectors[0], dtype=torch.float64)
    for v, wi in zip(vectors, w.tolist(), strict=True):
        out += wi * v.double()
    return out.to(vectors[0].dtype)


def rda(vectors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    w = _check(vectors, weights)
    radius = 0.0
    direction = torch.zeros_like(vectors[0], dtype=torch.float64)
    for v, wi in zip(vectors, w.tolist(), strict=True):
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
