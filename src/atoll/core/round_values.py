"""What a closing round computes for fragment p, by one of two paths that give the same values:

    merge the outer gradients theta - theta_m (merge.py: RDA or weighted mean), scale a light
    round (RoundWeight), take the outer step (outer.py), encode the change of the public value
    for the broadcast (delivery.py, codec.py)

- the reference path: one torch op at a time, in the modules named;
- the fused path (fused.py): two passes over the held frames for the merge, one for all the
  rest, for fragments the kernels take (`fused.kernels`: the `fused` setting), with outer `sgd`
  or `nesterov` and an int4 or int8 broadcast (`kernels_for`: its contributions are then held
  as their frames, `fused.Held`); otherwise the reference path.

Either raises codec.CodecError for a merged value that is not finite or not encodable: nothing
is committed then (SyncerProtocol drops the round)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from atoll.core import codec, fused, merge
from atoll.core.messages import FragmentUpdate, UpdateKind
from atoll.core.outer import OuterState


@dataclasses.dataclass
class RoundValues:
    theta: torch.Tensor  # the new exact value
    public: torch.Tensor  # what the learners hold after the broadcast
    outer_state: OuterState  # to be committed with it
    update: FragmentUpdate  # the broadcast
    scale: float  # the light round's factor


def kernels_for(proto: Any, p: int) -> Any | None:
    """The fused kernels when fragment p's round closes by them (then its contributions are
    held as their frames, `fused.Held`), else None."""
    if proto.outer.kind in ("sgd", "nesterov") and proto.cfg.down_codec in ("int4", "int8"):
        return fused.kernels(proto.plan.fragments[p].numel)
    return None


def close_values(
    proto: Any, p: int, values: Sequence[torch.Tensor], weights: Sequence[float],
    included: tuple, now: float,
) -> RoundValues:  # fmt: skip
    """The round of fragment p of `proto` (a SyncerProtocol) over the contributions' values
    `values` (theta_m) with their `weights`."""
    cfg = proto.cfg
    frag = proto.plan.fragments[p]
    sizes = [int(torch.Size(s).numel()) for s in frag.shapes]
    mean = frag.is_embedding or cfg.merge == "mean"
    scale = proto.round_weight.scale(p, sum(weights))
    outer_state = dataclasses.replace(proto.outer_state[p])  # committed with the merge
    v = proto.version[p] + 1
    theta = proto.theta[p]
    k = kernels_for(proto, p)
    held = [x for x in values if isinstance(x, fused.Held)]
    if k is None or len(held) != len(values) or len({x.scheme for x in held}) > 1:
        values = [x.values() if isinstance(x, fused.Held) else x for x in values]
        k = None
    if k is None:
        delta = merge.merge_flat(theta, values, weights, sizes, mean)
        if scale != 1.0:
            delta.mul_(scale)
        new = proto.outer.step(theta, delta, outer_state)
        update, public = proto.delivery.broadcast(p, v, new, included, now)
        return RoundValues(new, public, outer_state, update, scale)
    w = merge.normalized(values, weights)
    out, tscale = fused.merge(k, theta, values, w, sizes, mean, merge.CANCELLED)
    outer = proto.outer
    ok, top, new, buf, public, _sf, body = fused.step_encode(
        k, theta, out, tscale, sizes, scale, outer.kind, outer.lr, outer.mu, outer_state.buf,
        proto.state.public[p], cfg.down_codec, cfg.group, codec.QMAX[cfg.down_codec],
    )  # fmt: skip
    if not ok:
        raise codec.CodecError("the merged value is not finite")
    codec.check_encodable(top)
    if buf is not None:
        outer_state.buf = buf
    group = max(1, min(cfg.group, theta.numel()))
    frame = codec.framed(cfg.down_codec, theta.numel(), group, body)
    update = FragmentUpdate(p, v, UpdateKind.DELTA, v - 1, frame, included, now)
    return RoundValues(new, public, outer_state, update, scale)
