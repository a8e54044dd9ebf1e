"""A small syncer to feed fuzzed inputs to: 3 fragments (one of embeddings) of 5 tensors, and
what the families compare before and after an input (`fingerprint`)."""

from __future__ import annotations

from typing import Any

import torch

from atoll.core import codec, fused
from atoll.core.fragments import make_plan
from atoll.core.messages import Contribution
from atoll.core.syncer import SyncerConfig, SyncerProtocol
from fuzzing.base import frozen

SHAPES = {"emb": (6, 4), "a": (40,), "b": (30,), "c": (20,), "d": (9,)}
PLAN = make_plan(SHAPES, P=3, H=4, embeddings={"emb"})
LEARNERS = ("L0", "L1")


def init_values(seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    params = {k: torch.randn(s, generator=gen) for k, s in SHAPES.items()}
    return [PLAN.flatten(params, p) for p in range(PLAN.P)]


def make_syncer(**cfg: Any) -> SyncerProtocol:
    proto = SyncerProtocol(PLAN, init_values(), SyncerConfig(**cfg))
    for lid in LEARNERS:
        proto.on_join(0.0, lid)
    return proto


def valid_contribution(
    proto: SyncerProtocol, learner: str, p: int, seq: int, scheme: str = "fp32", seed: int = 0
) -> Contribution:
    """A contribution the syncer accepts: a small delta on the current version."""
    gen = torch.Generator().manual_seed(seed)
    delta = torch.randn(PLAN.fragments[p].numel, generator=gen) * 0.01
    payload = codec.encode(delta, scheme)
    return Contribution(learner, p, seq, proto.version[p], payload, 2, 128, 1.0, 0.1, 0.2)


def _values(theta: Any) -> Any:
    """A pending contribution's values: held as its frame on the fused path (`fused.Held`,
    decoded here as the reference decodes it), else the tensor itself."""
    return theta.values() if isinstance(theta, fused.Held) else theta


def fingerprint(proto: SyncerProtocol) -> Any:
    """The durable state (`state_dict()`, every tensor bit for bit) and, when the protocol
    exposes them, the pending contributions of the open rounds."""
    pend = getattr(proto, "pending", None)
    rounds = None
    if isinstance(pend, list):
        rounds = [
            sorted((k, x.c.seq, x.c.base_version, frozen(_values(x.theta))) for k, x in r.items())
            for r in pend
        ]
    return (frozen(proto.state_dict()), rounds)
