"""The syncer protocol's durable state: what a snapshot and a tape record hold.

Held by SyncerProtocol in two pieces: `GlobalState` (every fragment's exact global value,
the learners' public copy, its version, its outer-optimizer state, the public versions kept
(`History`), and the count of merges), and `Averages` (the running averages a restart
keeps: the grace window's and each fragment's usual round weight).

`state_dict()` is the whole state as plain values and tensors (it may be written without the
lock that guards the protocol: the current values are copies, and the history values are
shared or made afresh from the broadcast frames (core/history.py), which is safe because the
protocol never changes a tensor it holds in place, it replaces it); `load_state_dict()` puts
it back into a freshly built protocol (membership and open rounds are not state: learners
rejoin). A tape record is one fragment's state right after a merge (`fragment_state`),
replayed with `load_fragment_state`. The drivers serialize these dicts
(atoll.live.syncer.store); they never read or write the protocol's fields themselves.

    state_dict() = {"rounds_closed": int, "grace": {"step", "to_quorum", "sync", "round_weight.p"},
                    "fragments": [fragment_state(p) without grace/rounds, ...]}
    fragment_state(p) = {"fragment", "version", "theta", "public", "outer": {"buf", "acc",
                         "count"}, "history": {version: public value}, "rounds_closed",
                         "grace"}

Pending (unmerged) contributions are not durable: a restarted syncer starts every round
afresh, and timers of an earlier process never fire (round ids move on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from atoll.core.fragments import FragmentPlan
from atoll.core.grace import GracePolicy
from atoll.core.history import History
from atoll.core.memory import memory_bytes
from atoll.core.merge import RoundWeight
from atoll.core.outer import OuterState

__all__ = ["Averages", "GlobalState", "History", "memory_bytes"]  # memory: the formula


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def _same(t: torch.Tensor | None) -> torch.Tensor | None:
    return t


@dataclass
class Averages:
    """The running averages a restart keeps: the grace window's (step time, wait for the
    quorum, sync time) and each fragment's usual round weight."""

    grace: GracePolicy
    round_weight: RoundWeight

    def state_dict(self) -> dict[str, float | None]:
        g = self.grace
        return {"step": g.step.value, "to_quorum": g.to_quorum.value, "sync": g.sync.value,
                **self.round_weight.state()}  # fmt: skip

    def load_state_dict(self, st: dict[str, float | None]) -> None:
        self.grace.step.value = st.get("step")
        self.grace.to_quorum.value = st.get("to_quorum")
        self.grace.sync.value = st.get("sync")
        self.round_weight.load(st)  # absent in older snapshots: None, no scaling yet


class GlobalState:
    """Every fragment's exact global value `theta`, the learners' `public` copy of it, its
    `version`, its outer-optimizer state, the public versions kept, and `rounds_closed`; with
    the `averages` it is the protocol's whole durable state."""

    def __init__(
        self,
        plan: FragmentPlan,
        init: list[torch.Tensor],
        keep: int,
        averages: Averages,
        full_every: int = 16,
        max_bytes: int = 0,
    ) -> None:
        self.plan, self.keep, self.averages = plan, keep, averages
        self.theta = [v.detach().float().clone().reshape(-1) for v in init]
        # values held per fragment: the plan's, or 0 for one another shard serves
        self.numels = [v.numel() for v in self.theta]
        self.public = [v.clone() for v in self.theta]
        self.version = [0] * plan.P
        self.history = History(self.public, keep, full_every, max_bytes)
        self.outer_state = [OuterState() for _ in range(plan.P)]
        self.rounds_closed = 0

    def version_of(self, p: int) -> int:
        """Fragment p's version (-1 for an index out of range)."""
        return self.version[p] if 0 <= p < self.plan.P else -1

    def commit(
        self,
        p: int,
        theta: torch.Tensor,
        public: torch.Tensor,
        outer_state: OuterState,
        frame: bytes | None = None,
    ) -> None:
        """A merge of fragment p: its new values, the next version, one more round closed
        (`frame`: the delta broadcast to reach `public`, None when it was sent in full)."""
        self.theta[p], self.public[p], self.outer_state[p] = theta, public, outer_state
        self.version[p] += 1
        self.history.remember(p, self.version[p], public, frame)
        self.rounds_closed += 1

    def remember(self, p: int) -> None:
        """Keep the public value of fragment p's current version (the newest `history`)."""
        self.history.remember(p, self.version[p], self.public[p])

    def fragment_state(
        self, p: int, keep_history: int | None = None, copy: bool = True
    ) -> dict[str, Any]:
        """Fragment p's state, with its newest `keep_history` public versions (default: only
        the current one, which a tape record needs). `copy=False`: the protocol's own tensors,
        which it never writes into (a merge, a restore or a heal replaces them; the history's
        are never copied)."""
        st = self.outer_state[p]
        c = _clone if copy else _same
        return {
            "fragment": p,
            "version": self.version[p],
            "theta": c(self.theta[p]),
            "public": c(self.public[p]),
            "outer": {"buf": c(st.buf), "acc": c(st.acc), "count": st.count},
            "history": self.history.newest(p, keep_history or 1),
            "rounds_closed": self.rounds_closed,
            "grace": self.averages.state_dict(),
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
        self.history.load(p, st["history"], replace_history)
        self.remember(p)
        self.rounds_closed = st["rounds_closed"]
        self.averages.load_state_dict(st["grace"])

    def state_dict(self, keep_history: int | None = None, copy: bool = True) -> dict[str, Any]:
        """The whole durable state (copies; `copy=False`: the tensors held, `fragment_state`);
        `keep_history` public versions per fragment (default: as many as are held)."""
        keep = keep_history or self.keep
        return {
            "rounds_closed": self.rounds_closed,
            "grace": self.averages.state_dict(),
            "fragments": [self.fragment_state(p, keep, copy) for p in range(self.plan.P)],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        frags = state["fragments"]
        if len(frags) != self.plan.P:
            raise ValueError(f"state has {len(frags)} fragments, the plan {self.plan.P}")
        for st in frags:
            numel = self.numels[st["fragment"]]
            if st["theta"].numel() != numel:
                raise ValueError(
                    f"fragment {st['fragment']} has {st['theta'].numel()} values in the state, "
                    f"{numel} in the plan"
                )
            self.load_fragment_state(
                {**st, "rounds_closed": state["rounds_closed"], "grace": state["grace"]},
                replace_history=True,
            )


class StateView:
    """The durable state's figures and dicts as a protocol shows them (`self.state`)."""

    state: GlobalState

    @property
    def theta(self) -> list[torch.Tensor]:
        return self.state.theta

    @property
    def public(self) -> list[torch.Tensor]:
        return self.state.public

    @property
    def version(self) -> list[int]:
        return self.state.version

    @property
    def history(self) -> History:
        return self.state.history

    @property
    def outer_state(self) -> list[OuterState]:
        return self.state.outer_state

    @property
    def rounds_closed(self) -> int:
        return self.state.rounds_closed

    def fragment_state(
        self, p: int, keep_history: int | None = None, copy: bool = True
    ) -> dict[str, Any]:
        return self.state.fragment_state(p, keep_history, copy)

    def load_fragment_state(self, st: dict[str, Any], replace_history: bool = False) -> None:
        self.state.load_fragment_state(st, replace_history)

    def state_dict(self, keep_history: int | None = None, copy: bool = True) -> dict[str, Any]:
        """`GlobalState.state_dict`; `copy=False`: the protocol's own tensors, which it
        replaces at each merge and never writes into (a snapshot may write them after the
        lock is let go: no copy, and the lock is held for microseconds)."""
        return self.state.state_dict(keep_history, copy)
