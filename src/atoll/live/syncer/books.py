"""The run's books on the live syncer: tokens and step-seconds per learner incarnation, the
byte and refusal counts, the epochs this run's syncer has had. Persisted with the tape and
the snapshots (the dict itself, `acct`).

Bounded whatever the learners send: only a learner with a live session is counted (a
heartbeat without one changes nothing); its counters must be within the core's bounds
(atoll.core.checks.check_counters); when a learner joins with a new incarnation its earlier
ones are folded into one "ended" entry, and past MAX_ENTRIES entries every one without a live
session is folded too. The epochs kept are the newest MAX_EPOCHS.
"""

from __future__ import annotations

import math
import time
from collections.abc import Container
from typing import Any

from atoll.core.checks import check_counters
from atoll.metrics import Figures, combine_figures

ENDED = "(ended)"  # the entry that holds every folded incarnation's counters
MAX_ENTRIES = 512
MAX_EPOCHS = 64


def set_figures(books: list[dict[str, Any]]) -> dict[str, Any]:
    """A shard set's goodput and its window from its shards' syncer_final.json: their useful
    seconds over the earliest join to the latest contribution any shard took."""
    parts = [
        Figures(useful_s=b.get("useful_s", 0.0), start=b.get("first_join"),
                last_accepted=b.get("last_accepted"))
        for b in books
    ]  # fmt: skip
    f = combine_figures(parts, int(books[0].get("learners", 1)) if books else 1)
    return {"first_join": f.start, "last_accepted": f.last_accepted, "goodput": f.goodput(),
            "training_window_s": f.window_s() or 0.0}  # fmt: skip


def new_accounts() -> dict[str, Any]:
    """The run's books (persisted with the tape and the snapshots)."""
    return {
        "start": time.time(),
        "tokens": {},  # "learner/incarnation" -> tokens trained
        "work_s": {},  # "learner/incarnation" -> step-seconds computed
        "useful_s": 0.0,
        "bytes_in": 0,
        "bytes_out": 0,
        "accepted": 0,
        "refused": 0,
        "refused_beats": 0,
        "broken_transfers": 0,
        "auth_refused": 0,
        "restarts": 0,
        "lost_committed_rounds": 0,
        "start_at": 0.0,
        "first_join": None,  # goodput's window (metrics.Figures): the first join ...
        "last_accepted": None,  # ... to the latest contribution accepted
        "epochs": [],
    }


class Books:
    def __init__(self, acct: dict[str, Any]) -> None:
        self.acct = acct

    def started(self, epoch: str) -> None:
        epochs = [*self.acct.get("epochs", []), epoch]
        self.acct["epochs"] = epochs[-MAX_EPOCHS:]

    def figures(self, rounds: int, learners: int) -> Figures:
        """The run's figures (metrics.Figures) as these books fold this syncer's events,
        with `rounds` closed of `learners` expected."""
        a = self.acct
        return Figures(
            learners=max(learners, 1),
            heard_tokens=self.total_tokens(),
            rounds=rounds,
            accepted=a["accepted"],
            received_bytes=a["bytes_in"],
            useful_s=a["useful_s"],
            start=a.get("first_join"),
            last_accepted=a.get("last_accepted"),
        )

    def final(self, rounds: int, learners: int) -> dict[str, Any]:
        """The figures syncer_final.json adds to the books."""
        f = self.figures(rounds, learners)
        return {"rounds": f.rounds, "learners": f.learners, "goodput": f.goodput(),
                "training_window_s": f.window_s() or 0.0}  # fmt: skip

    def epochs(self) -> list[str]:
        return list(self.acct.get("epochs", []))

    def total_tokens(self) -> int:
        return int(sum(self.acct["tokens"].values()))

    def joined(self, learner: str, incarnation: str) -> None:
        """A learner's new session: its other incarnations have ended."""
        keep = f"{learner}/{incarnation}"
        self._fold(lambda k: k.startswith(f"{learner}/") and k != keep)

    def beat(self, learner: str, incarnation: str, steps: int, tokens: int, work_s: float) -> bool:
        """A live session's counters since it (re)joined; False (nothing counted) when they
        are beyond the bounds."""
        if not math.isfinite(work_s) or work_s < 0 or check_counters(steps, tokens, work_s):
            self.acct["refused_beats"] = self.acct.get("refused_beats", 0) + 1
            return False
        key = f"{learner}/{incarnation}"
        a = self.acct
        a["tokens"][key] = max(a["tokens"].get(key, 0), tokens)
        a["work_s"][key] = max(a["work_s"].get(key, 0.0), work_s)
        return True

    def bound(self, live: Container[str]) -> None:
        """Past MAX_ENTRIES entries, fold every one whose learner has no live session."""
        if len(self.acct["tokens"]) > MAX_ENTRIES:
            self._fold(lambda k: k != ENDED and k.rsplit("/", 1)[0] not in live)

    def _fold(self, which: Any) -> None:
        for book in ("tokens", "work_s"):
            d = self.acct[book]
            for k in [k for k in d if k != ENDED and which(k)]:
                d[ENDED] = d.get(ENDED, 0) + d.pop(k)
