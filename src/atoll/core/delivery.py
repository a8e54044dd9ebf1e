"""What the syncer hands its driver for delivery (mixed into SyncerProtocol): one update in
place of two that a learner has not yet been sent, and the exact global parameters."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import torch

from atoll.core import codec
from atoll.core.messages import FragmentUpdate


class Delivery:
    plan: Any
    theta: list[torch.Tensor]
    history: list[OrderedDict[int, torch.Tensor]]

    def coalesce(self, old: FragmentUpdate, new: FragmentUpdate) -> FragmentUpdate:
        """One update in place of two of the same fragment that a learner has not yet been
        sent: the newer one, listing what both included; when the newer is a delta it no
        longer chains, so the public value of its version goes in full instead."""
        included = tuple(dict.fromkeys(old.included + new.included))
        if new.kind == "delta":
            value = self.history[new.fragment].get(new.version)
            if value is None:
                raise ValueError(
                    f"version {new.version} of fragment {new.fragment} is no longer held"
                )
            full = codec.encode(value, "fp32")
            return dataclasses.replace(new, kind="full", payload=full, included=included)
        return dataclasses.replace(new, included=included)

    def global_params(self) -> dict[str, torch.Tensor]:
        """The exact global parameters by name (copies)."""
        out = {}
        for p, f in enumerate(self.plan.fragments):
            for name, t in zip(f.names, self.plan.split(p, self.theta[p]), strict=True):
                out[name] = t.clone()
        return out
