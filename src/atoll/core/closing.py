"""Closing a syncer round (the protocol's part that decides when a fragment's round closes and
what closing it does; core/syncer.py's docstring, steps 2-5): at the quorum, the grace window
or the pull's answer window (`_maybe_close`), then merge, outer step and broadcast
(`_close`: the values in core/round_values.py), or the round dropped when its merge is not
finite (`_drop`). A part of `SyncerProtocol`, which holds the fields it reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from atoll.core import codec, fused
from atoll.core.events import Event, MergeRefused, RoundClosed
from atoll.core.messages import CloseRound, Commit, Send, SetTimer, SyncerOutput, UpdateKind
from atoll.core.round_values import close_values

if TYPE_CHECKING:
    from atoll.core.checks import Pending


class RoundClosing:
    pending: list[dict[str, Pending]]
    quorum_at: list[float | None]
    round_id: list[int]
    live: set[str]
    listening: set[str]
    served: list[int]
    _spare: list[torch.Tensor]
    _answer_window: bool
    cfg: Any
    grace: Any
    pulled: Any
    state: Any
    round_weight: Any
    version: Any

    def close_all(self, now: float) -> list[SyncerOutput]:
        """The end of a run (nothing more will arrive): close every open round now."""
        out: list[SyncerOutput] = []
        for p in self.served:
            if self.pending[p]:
                out += self._close(now, p)
        return out

    def _maybe_close(self, now: float, p: int) -> list[SyncerOutput]:
        pend = self.pending[p]
        if not pend or len(pend) < min(self.cfg.quorum, max(len(self.live), 1)):
            return []
        if self.quorum_at[p] is None:
            self.quorum_at[p] = now
            first = min(x.c.sent_at for x in pend.values())
            self.grace.observe(self.grace.to_quorum, now - first)
        if self._answer_window and self.pulled.waiting(p):  # a pull's answers (pacing.py)
            if self.listening <= set(pend) or self.pulled.due(p, now):
                return self._close(now, p)
            return []  # the deadline's timer is set
        # every learner that could have sent has: with the pull schedule those that can hear
        # pulls (a session that never listens, or cannot now, is not waited for)
        everyone = (self.listening if self.cfg.schedule == "pull" else self.live) <= set(pend)
        window = self.grace.window()
        if everyone or window <= 0 or now >= self.quorum_at[p] + window:
            return self._close(now, p)
        return [SetTimer(self.quorum_at[p] + window, CloseRound(p, self.round_id[p]))]

    def _close(self, now: float, p: int) -> list[SyncerOutput]:
        pend = self.pending[p]
        ids = sorted(pend)
        weights = [pend[i].weight for i in ids]
        total = sum(weights)
        v = self.version[p] + 1
        included = tuple((i, pend[i].c.seq) for i in ids)
        try:  # merge, outer step, broadcast encode (round_values.py: reference or fused)
            got = close_values(self, p, [pend[i].theta for i in ids], weights, included, now)
        except codec.CodecError as exc:  # never committed: the round is dropped
            return self._drop(now, p, ids, str(exc))
        update, scale = got.update, got.scale
        frame = update.payload if update.kind == UpdateKind.DELTA else None
        old = (self.state.theta[p], self.state.public[p], self.state.outer_state[p].buf)
        self.state.commit(p, got.theta, got.public, got.outer_state, frame)
        fused.give(*old)  # (the next closes' buffers, once nothing holds them)
        self.round_weight.committed(p, total)
        quorum_wait = (self.quorum_at[p] or now) - min(x.c.sent_at for x in pend.values())
        event = RoundClosed(
            fragment=p,
            version=v,
            participants=ids,
            weights=[round(w, 3) for w in weights],
            scale=round(scale, 4),
            staleness=[pend[i].staleness for i in ids],
            quorum_wait_s=quorum_wait,
            grace_s=now - (self.quorum_at[p] or now),
            bytes_in=sum(pend[i].nbytes for i in ids),
            bytes_out=len(update.payload) * len(self.live),
        )
        # time to deliver the result: the links are taken as symmetric, so the answer is
        # expected to travel as fast as the contributions did (scaling by the size ratio would
        # also scale the latency, which dominates small fragments, and starve the window)
        uploads = [max(pend[i].arrived - pend[i].c.sent_at, 0.0) for i in ids]
        self.grace.observe(self.grace.sync, max(uploads))
        self._reset_round(p)
        self._recycle([pend[i].theta for i in ids])
        sends = [Send(lid, update) for lid in sorted(self.live)]
        return [Commit(p, v), *sends, Event(now, "syncer", event)]

    def _recycle(self, thetas: list[torch.Tensor]) -> None:
        """A closed round's decode buffers serve the next contributions, of any fragment
        (fresh memory costs a page fault per 4 KiB on its first write: ~20 ms per 16M values;
        a buffer smaller than a fragment's frame is not used for it, intake.decode_from)."""
        for t in thetas:  # an int frame's values: a view of its buffer (intake.decode_from)
            if (
                isinstance(t, torch.Tensor)
                and t._base is not None
                and len(self._spare) < len(self.live)
            ):
                self._spare.append(t._base)

    def _reset_round(self, p: int) -> None:
        self.pulled.closed(p)
        self.pending[p] = {}
        self.quorum_at[p] = None
        self.round_id[p] += 1

    def _drop(self, now: float, p: int, ids: list[str], reason: str) -> list[SyncerOutput]:
        """A merge that would make fragment p non-finite (or not encodable): nothing of it
        is committed; its contributions are dropped and the learners send again."""
        self._reset_round(p)
        return [Event(now, "syncer", MergeRefused(p, ids, reason))]
