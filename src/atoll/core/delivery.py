"""What the syncer hands its driver for delivery (held by SyncerProtocol): what a learner is
sent for a fragment when updates queue up for it (a slow link), and the exact global
parameters."""

from __future__ import annotations

import dataclasses

import torch

from atoll.core import codec
from atoll.core.fragments import FragmentPlan
from atoll.core.messages import FragmentUpdate, UpdateKind
from atoll.core.state import GlobalState


class Delivery:
    def __init__(
        self, plan: FragmentPlan, state: GlobalState, down_codec: str, heal_codec: str, group: int
    ) -> None:
        self.plan, self.state, self.group = plan, state, group
        self.down_codec, self.heal_codec = down_codec, heal_codec

    def broadcast(
        self, p: int, version: int, theta: torch.Tensor, included: tuple, now: float
    ) -> tuple[FragmentUpdate, torch.Tensor]:
        """The update that brings the learners to fragment p's new exact value `theta`
        (`version`), and their public value after it: in full (`down_codec` fp32), or the
        change of the public value quantized (what is not sent is carried into the next
        broadcast: the exact value is kept apart). Raises codec.CodecError for a value that
        is not finite or not encodable."""
        if not codec.all_finite(theta):
            raise codec.CodecError("the merged value is not finite")
        if self.down_codec == "fp32":
            public = theta.clone()
            frame = codec.encode(public, "fp32")
            kind = UpdateKind.FULL
        else:
            change = theta - self.state.public[p]
            frame, sent = codec.encode_sent(change, self.down_codec, self.group)
            public = self.state.public[p] + sent  # what a learner decodes (the same arithmetic)
            kind = UpdateKind.DELTA
        return FragmentUpdate(p, version, kind, version - 1, frame, included, now), public

    def coalesce(
        self, queued: tuple[FragmentUpdate, ...], new: FragmentUpdate
    ) -> tuple[FragmentUpdate, ...]:
        """What a learner is sent for one fragment in place of `queued` (not yet sent) and
        `new`, in order. A delta that chains onto the last queued one joins the queue while
        the queue stays smaller than the fragment in fp32: each applies exactly on the one
        before it, so a slow link still gets int4 deltas. Beyond that, or when it does not
        chain, one update of the newest version in full, listing what they all included."""
        chain = (*queued, new)
        p = new.fragment
        if new.kind == UpdateKind.DELTA and queued[-1].version == new.base_version:
            if sum(len(u.payload) for u in chain) <= 4 * self.plan.fragments[p].numel:
                return chain
        included = tuple(dict.fromkeys(i for u in chain for i in u.included))
        if new.kind == UpdateKind.DELTA:
            value = self.state.history[p].get(new.version)
            if value is None:
                raise ValueError(f"version {new.version} of fragment {p} is no longer held")
            full = codec.encode(value, self.heal_codec, self.group)
            return (
                dataclasses.replace(new, kind=UpdateKind.FULL, payload=full, included=included),
            )
        return (dataclasses.replace(new, included=included),)

    def global_params(self) -> dict[str, torch.Tensor]:
        """The exact global parameters by name (copies): of the fragments held (a shard
        holds only its own)."""
        out = {}
        for p, f in enumerate(self.plan.fragments):
            if self.state.numels[p] != f.numel:
                continue
            for name, t in zip(f.names, self.plan.split(p, self.state.theta[p]), strict=True):
                out[name] = t.clone()
        return out
