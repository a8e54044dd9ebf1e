"""Run statistics from the event stream (atoll.core.events), for both drivers.

The virtual-time driver's results and the live run's summary both come from `run_stats`; the
status page, metrics and report of a live run are to read the same stream. Every figure here is
a plain fold over events in stream order, so a given stream always gives the same numbers.

    goodput         useful step-seconds (the work carried by contributions the syncer
                    accepted) / (learners x window)
    rounds ...      merges; learners per merge and its histogram; staleness of contributions
    bytes_in/out    contribution bytes the syncer merged / update bytes it broadcast
    blocked_s       learner time spent waiting at step boundaries
    down_s          learner downtime (failure to rejoin), failures, lost_work_s
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from atoll.core.events import Event


def _of(events: Iterable[Event], kind: str) -> list[Event]:
    return [e for e in events if e.kind == kind]


def round_stats(events: Iterable[Event]) -> dict[str, Any]:
    rounds = _of(events, "round_closed")
    parts = [len(e.data.participants) for e in rounds]
    stale = [s for e in rounds for s in e.data.staleness]
    hist: dict[str, int] = {}
    for n in parts:
        hist[str(n)] = hist.get(str(n), 0) + 1
    return {
        "rounds": len(rounds),
        "participants_mean": sum(parts) / max(len(parts), 1),
        "participants_hist": hist,
        "staleness_mean": sum(stale) / max(len(stale), 1),
        "staleness_max": max(stale, default=0),
        "merged_bytes_in": sum(e.data.bytes_in for e in rounds),
        "merged_bytes_out": sum(e.data.bytes_out for e in rounds),
    }


def useful_work(events: Iterable[Event]) -> float:
    """Step-seconds whose work reached the syncer (in accepted contributions)."""
    useful = 0.0
    for e in events:
        if e.kind == "accepted":
            useful += e.data.work_s
    return useful


def goodput(events: Iterable[Event], learners: int, window_s: float) -> float:
    return goodput_of(useful_work(events), learners, window_s)


def goodput_of(useful_s: float, learners: int, window_s: float) -> float:
    """Goodput from the useful step-seconds (`useful_work`) of `learners` over `window_s`."""
    return min(useful_s / max(learners * window_s, 1e-9), 1.0)


def _total(events: Iterable[Event], kind: str, field: str) -> float:
    total = 0.0
    for e in events:
        if e.kind == kind:
            total += e.data[field]
    return total


def run_stats(events: list[Event], learners: int, window_s: float) -> dict[str, Any]:
    """Every statistic this module computes, for a run of `learners` over `window_s`."""
    return {
        "goodput": goodput(events, learners, window_s),
        **round_stats(events),
        "blocked_s": _total(events, "blocked", "wait_s"),
        "down_s": _total(events, "rejoined", "downtime_s"),
        "lost_work_s": _total(events, "failed", "lost_steps_s"),
        "failures": len(_of(events, "failed")),
        "refused": len(_of(events, "refused")),
    }


def rejoin_times(events: list[Event]) -> tuple[list[float], float]:
    """Live runs: seconds from each learner restart to its first training step, and the
    total downtime (from each kill or crash to training again)."""
    out, down = [], 0.0
    kills: dict[str, float] = {}
    for e in events:
        if e.kind == "chaos" and e.data.action == "kill":
            kills[e.data.process] = e.t
        if e.kind == "crashed":
            kills.setdefault(e.data.process, e.t)
    for e in events:
        if e.kind != "restarted" or e.data.process == "syncer":
            continue
        lid, t = e.data.process, e.t
        nxt = next(
            (x for x in events if x.kind == "training" and x.source == lid and x.t > t), None
        )
        if nxt is not None:
            out.append(round(nxt.t - t, 3))
            if lid in kills:
                down += nxt.t - kills.pop(lid)
    return out, down


def syncer_rejoins(events: Iterable[Event]) -> list[float]:
    """Rejoins as a syncer sees them (a run without `atoll run`'s launcher): a learner back
    with a new incarnation (a new process), in seconds from its previous session's loss to
    its join (from its previous join when no loss was seen: a syncer restart in between). A
    shard set's shards log each join and loss: an incarnation counts once."""
    out: list[float] = []
    inc: dict[str, tuple[str | None, float]] = {}  # learner -> (incarnation, joined at)
    lost: dict[str, float] = {}
    for e in events:
        if e.kind == "lost":
            lost.setdefault(e.data.learner, e.t)
        elif e.kind == "joined":
            lid, now = e.data.learner, e.data.incarnation
            was = inc.get(lid)
            if was is not None and was[0] == now:
                continue
            if was is not None:
                out.append(round(e.t - lost.get(lid, was[1]), 3))
            inc[lid] = (now, e.t)
            lost.pop(lid, None)
    return out
