"""A syncer split into shards: which fragments each shard serves, and who it is.

The fragments are dealt to S shards by bytes with the same largest-first packing the plan uses
for tensors (fragments.balanced_pack): every shard and every learner computes the same
assignment from the plan alone. A shard is one syncer process (`atoll syncer --shard i/S`): it
holds, merges, broadcasts and records only its fragments; for the others it holds nothing (an
empty tensor, version 0) and refuses contributions. Each shard keeps its own tape, snapshots,
pull clock and membership.

How the shards stay consistent (docs/deploy.md, "A sharded syncer"):
- membership: a learner joins every shard (one connection each, learners take the shard
  addresses in order); each shard admits, heals or resumes it for its own fragments;
- the token budget: counted by every shard from the learners' heartbeats, which go to every
  shard; learners take the stop and the tokens left from shard 0 (the home shard); each shard's
  run is over by its own count (core/budget.py, `RunEnd`), and the set when every shard's is;
- the pull schedule: fragment p is pulled at the ticks g with g mod H = offset(p) by the shard
  that serves it; every shard times its tick clock from the same step reports, so each
  fragment is still synchronised once per H steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from atoll.core.fragments import FragmentPlan, balanced_pack
from atoll.errors import ConfigError


@dataclass(frozen=True)
class ShardSpec:
    """Shard `index` of `count` (0 <= index < count)."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> ShardSpec:
        """'i/S' -> ShardSpec(i, S); a clear error for anything else."""
        allowed = "i/S with 0 <= i < S, e.g. 0/2 for the first of two shards"
        try:
            i, s = (int(x) for x in text.split("/"))
        except ValueError:
            raise ConfigError("shard", text, allowed) from None
        if s < 1 or not 0 <= i < s:
            raise ConfigError("shard", text, allowed)
        return cls(i, s)

    def check(self, P: int) -> None:
        """A shard count must leave every shard a fragment: 1 <= S <= P."""
        if not 1 <= self.count <= P:
            raise ConfigError("shards", self.count, f"1 to the plan's {P} fragments")

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


def assign(numels: Sequence[int], shards: int) -> list[int]:
    """The shard of each fragment, balanced by size (largest first, to the lightest shard)."""
    if not 1 <= shards <= len(numels):
        raise ConfigError("shards", shards, f"1 to the plan's {len(numels)} fragments")
    width = len(str(len(numels)))
    bins = balanced_pack({f"{p:0{width}d}": n for p, n in enumerate(numels)}, shards)
    out = [0] * len(numels)
    for s, names in enumerate(bins):
        for name in names:
            out[int(name)] = s
    return out


def owned(plan: FragmentPlan, spec: ShardSpec) -> frozenset[int]:
    """The fragments shard `spec` serves."""
    spec.check(plan.P)
    shard_of = assign([f.numel for f in plan.fragments], spec.count)
    return frozenset(p for p, s in enumerate(shard_of) if s == spec.index)


def identity(plan: FragmentPlan, spec: ShardSpec, run_id: str) -> dict:
    """What a shard's run directory records of it (`shard.json`): a shard started on another
    shard's directory, or another run's, stops before it reads any state."""
    return {
        "run_id": run_id,
        "shard": spec.index,
        "shards": spec.count,
        "fragments": sorted(owned(plan, spec)),
    }


def check_identity(found: dict, want: dict, where: str) -> None:
    """One line naming what differs between the shard a directory holds and this one."""
    for key in ("run_id", "shards", "shard", "fragments"):
        if found.get(key) != want[key]:
            f = found
            held = f"shard {f.get('shard')}/{f.get('shards')} of run {f.get('run_id')!r}"
            this = f"shard {want['shard']}/{want['shards']} of run {want['run_id']!r}"
            raise ConfigError(
                "run-dir",
                where,
                f"it holds {held} ({key} differs), this is {this}: give each shard its own "
                "directory (atoll syncer --shards S uses RUN_DIR/shard-i)",
            )
