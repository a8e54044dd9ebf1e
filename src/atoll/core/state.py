"""The syncer protocol's durable state: what a snapshot and a tape record hold.

`state_dict()` is the whole state as plain values and tensors (it may be written without the
lock that guards the protocol: the current values are copies, and the history values are
shared, which is safe because the protocol never changes a tensor it holds in place, it
replaces it); `load_state_dict()` puts it back into a freshly built protocol (membership and
open rounds are not state: learners rejoin). A tape record is
one fragment's state right after a merge (`fragment_state`), replayed with
`load_fragment_state`. The drivers serialize these dicts (atoll.live.syncer.store); they
never read or write the protocol's fields themselves.

    state_dict() = {"rounds_closed": int, "grace": {"step", "to_quorum", "sync", "round_weight.p"},
                    "fragments": [fragment_state(p) without grace/rounds, ...]}
    fragment_state(p) = {"fragment", "version", "theta", "public", "outer": {"buf", "acc",
                         "count"}, "history": {version: public value}, "rounds_closed",
                         "grace"}

Pending (unmerged) contributions are not durable: a restarted syncer starts every round
afresh, and timers of an earlier process never fire (round ids move on).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from atoll.core.outer import OuterState


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def _same(t: torch.Tensor | None) -> torch.Tensor | None:
    return t


class DurableState:
    """Mixed into SyncerProtocol: its state in and out."""

    plan: Any
    cfg: Any
    theta: list[torch.Tensor]
    public: list[torch.Tensor]
    version: list[int]
    history: list[OrderedDict[int, torch.Tensor]]
    outer_state: list[OuterState]
    grace: Any
    round_weight: Any
    rounds_closed: int
    round_id: list[int]
    restored_versions: list[int]

    def _remember(self, p: int) -> None:
        """Keep the public value of fragment p's current version (the newest `history`)."""
        hist = self.history[p]
        hist[self.version[p]] = self.public[p].clone()
        while len(hist) > self.cfg.history:
            hist.popitem(last=False)

    def _grace_state(self) -> dict[str, float | None]:
        """The running averages: the grace window's, each fragment's usual round weight."""
        g = self.grace
        return {"step": g.step.value, "to_quorum": g.to_quorum.value, "sync": g.sync.value,
                **self.round_weight.state()}  # fmt: skip

    def _set_grace(self, st: dict[str, float | None]) -> None:
        self.grace.step.value = st.get("step")
        self.grace.to_quorum.value = st.get("to_quorum")
        self.grace.sync.value = st.get("sync")
        self.round_weight.load(st)  # absent in older snapshots: None, no scaling yet

    def fragment_state(
        self, p: int, keep_history: int | None = None, copy: bool = True
    ) -> dict[str, Any]:
        """Fragment p's state, with its newest `keep_history` public versions (default: only
        the current one, which a tape record needs). `copy=False`: the protocol's own tensors
        (to be serialized at once, under the lock)."""
        st = self.outer_state[p]
        items = list(self.history[p].items())[-(keep_history or 1) :]
        c = _clone if copy else _same
        return {
            "fragment": p,
            "version": self.version[p],
            "theta": c(self.theta[p]),
            "public": c(self.public[p]),
            "outer": {"buf": c(st.buf), "acc": c(st.acc), "count": st.count},
            "history": dict(items),
            "rounds_closed": self.rounds_closed,
            "grace": self._grace_state(),
        }

    def load_fragment_state(self, st: dict[str, Any], replace_history: bool = False) -> None:
        """Put fragment st["fragment"] back; history versions are added to what is held
        (a tape record), or replace it (a snapshot)."""
        p = st["fragment"]
        self.theta[p] = st["theta"].clone()
        self.public[p] = st["public"].clone()
        self.version[p] = st["version"]
        o = st["outer"]
        self.outer_state[p] = OuterState(_clone(o.get("buf")), _clone(o.get("acc")), o["count"])
        if replace_history:
            self.history[p] = OrderedDict()
        for v, t in sorted(st["history"].items()):
            self.history[p][v] = t.clone()
        self._remember(p)
        self.rounds_closed = st["rounds_closed"]
        self._set_grace(st["grace"])

    def state_dict(self, keep_history: int | None = None) -> dict[str, Any]:
        """The whole durable state (copies); `keep_history` public versions per fragment
        (default: as many as the protocol holds)."""
        keep = keep_history or self.cfg.history
        return {
            "rounds_closed": self.rounds_closed,
            "grace": self._grace_state(),
            "fragments": [self.fragment_state(p, keep) for p in range(self.plan.P)],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        frags = state["fragments"]
        if len(frags) != self.plan.P:
            raise ValueError(f"state has {len(frags)} fragments, the plan {self.plan.P}")
        for st in frags:
            numel = self.plan.fragments[st["fragment"]].numel
            if st["theta"].numel() != numel:
                raise ValueError(
                    f"fragment {st['fragment']} has {st['theta'].numel()} values in the state, "
                    f"{numel} in the plan"
                )
            self.load_fragment_state(
                {**st, "rounds_closed": state["rounds_closed"], "grace": state["grace"]},
                replace_history=True,
            )
        self.loaded()

    def loaded(self) -> None:
        """After a restore: timers of the earlier process never fire, and the versions now
        held are what learners of an earlier epoch are checked against."""
        self.round_id = [r + 1 for r in self.round_id]
        self.restored_versions = list(self.version)
