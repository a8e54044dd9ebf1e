"""What the syncer hands its driver for delivery (mixed into SyncerProtocol): what a learner
is sent for a fragment when updates queue up for it (a slow link), and the exact global
parameters."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import torch

from atoll.core import codec
from atoll.core.messages import FragmentUpdate, UpdateKind


class Delivery:
    plan: Any
    cfg: Any
    theta: list[torch.Tensor]
    history: list[OrderedDict[int, torch.Tensor]]

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
            value = self.history[p].get(new.version)
            if value is None:
                raise ValueError(f"version {new.version} of fragment {p} is no longer held")
            full = codec.encode(value, self.cfg.heal_codec, self.cfg.group)
            return (
                dataclasses.replace(new, kind=UpdateKind.FULL, payload=full, included=included),
            )
        return (dataclasses.replace(new, included=included),)

    def global_params(self) -> dict[str, torch.Tensor]:
        """The exact global parameters by name (copies)."""
        out = {}
        for p, f in enumerate(self.plan.fragments):
            for name, t in zip(f.names, self.plan.split(p, self.theta[p]), strict=True):
                out[name] = t.clone()
        return out
