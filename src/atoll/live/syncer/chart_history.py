"""What the status page's charts draw, kept by the syncer for the whole run (`/history.json`),
so that a page opened at any time draws the run from its start: goodput, tokens and rounds at
each round closed (metrics.Figures, the same fold /status.json reads), and the learners'
tokens/s from the tokens their beats report.

Bounded whatever the run's length: past MAX_POINTS points every other one is dropped (the
oldest half kept thinner), so a long run is drawn whole at a coarser grain.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from atoll.core.events import Evaluated, Event, RoundClosed
from atoll.metrics import Figures, goodput_of

MAX_POINTS = 2000
RATE_WINDOW_S = 10.0  # tokens/s: over the beats of the last this many seconds


class ChartHistory:
    def __init__(self) -> None:
        self.points: list[dict[str, Any]] = []

    def add(self, t: float, f: Figures) -> None:
        """The figures `f` at time `t` (a round closed)."""
        if self.points and self.points[-1]["t"] == t:
            self.points.pop()
        self.points.append({"t": t, "tokens": f.total_tokens(), "rounds": f.rounds,
                            "goodput": f.goodput(), "useful_s": f.useful_s})  # fmt: skip
        if len(self.points) > MAX_POINTS:
            self.points = self.points[::2] if len(self.points) % 2 else self.points[1::2]

    def series(self) -> list[dict[str, Any]]:
        return list(self.points)


def replayed(events: list[Event], learners: int) -> ChartHistory:
    """The points of a run's stream so far, for a restarted syncer (its charts keep the run
    before the restart): at each round closed, the fold's figures then; tokens where the
    stream holds the learners' step reports, else the latest evaluation's."""
    h, f, evaluated = ChartHistory(), Figures(learners), 0
    for e in events:
        f.feed(e)
        if isinstance(e.data, Evaluated):
            evaluated = e.data.tokens
        elif isinstance(e.data, RoundClosed):
            f.heard_tokens = None if f.tokens else evaluated
            h.add(e.t, f)
    return h


def combine_history(
    shards: list[list[dict[str, Any]]], start: float | None, learners: int
) -> list[dict[str, Any]]:
    """A shard set's chart points from its shards': at each shard's point, the rounds and
    useful seconds summed over every shard's latest point by then, the home shard's (the
    first's) tokens, and goodput over the set's window from `start` (its first join)."""
    timeline = sorted((p["t"], i, p) for i, pts in enumerate(shards) for p in pts
                      if isinstance(p, dict) and isinstance(p.get("t"), int | float))  # fmt: skip
    latest: dict[int, dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    for t, i, p in timeline:
        latest[i] = p
        useful = sum(float(q.get("useful_s") or 0) for q in latest.values())
        window = t - start if start is not None else 0.0
        out.append({
            "t": t,
            "tokens": int((latest.get(0) or {}).get("tokens") or 0),
            "rounds": sum(int(q.get("rounds") or 0) for q in latest.values()),
            "goodput": goodput_of(useful, max(learners, 1), window) if window > 0 else 0.0,
            "useful_s": useful,
        })  # fmt: skip
    return out[-MAX_POINTS:]


class TokenRates:
    """Each learner incarnation's tokens/s over its last RATE_WINDOW_S seconds of reports."""

    def __init__(self) -> None:
        self.seen: dict[str, deque[tuple[float, int]]] = {}

    def rate(self, key: str, now: float, tokens: int) -> float:
        q = self.seen.setdefault(key, deque())
        if not q or tokens != q[-1][1]:
            q.append((now, tokens))
        while len(q) > 2 and now - q[1][0] > RATE_WINDOW_S:
            q.popleft()
        (t0, k0), (t1, k1) = q[0], q[-1]
        return (k1 - k0) / (t1 - t0) if t1 > t0 and k1 >= k0 else 0.0

    def keep(self, keys: set[str]) -> None:
        """Forget the incarnations no longer live."""
        for k in [k for k in self.seen if k not in keys]:
            del self.seen[k]
