"""Run statistics from the event stream (atoll.core.events), for both drivers.

The virtual-time driver's results come from `run_stats`; every surface of a live run reads
`Figures`, one fold of its stream (goodput's window and tokens are defined there). Every
figure here is a plain fold over events in stream order, so a given stream always gives the
same numbers.

    goodput         useful step-seconds (the work carried by contributions the syncer
                    accepted) / (learners x window)
    rounds ...      merges; learners per merge and its histogram; staleness of contributions
    bytes_in/out    contribution bytes the syncer merged / update bytes it broadcast
    blocked_s       learner time spent waiting at step boundaries
    down_s          learner downtime (failure to rejoin), failures, lost_work_s
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from atoll.core import events as ev
from atoll.core.events import Accepted, Event, Joined, RoundClosed, Step


def _of(events: Iterable[Event], cls: type[ev.Record]) -> list[Event]:
    return [e for e in events if isinstance(e.data, cls)]


def round_stats(events: Iterable[Event]) -> dict[str, Any]:
    rounds = _of(events, RoundClosed)
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
        if isinstance(e.data, Accepted):
            useful += e.data.work_s
    return useful


def goodput(events: Iterable[Event], learners: int, window_s: float) -> float:
    return goodput_of(useful_work(events), learners, window_s)


def goodput_of(useful_s: float, learners: int, window_s: float) -> float:
    """Goodput from the useful step-seconds (`useful_work`) of `learners` over `window_s`."""
    return min(useful_s / max(learners * window_s, 1e-9), 1.0)


def _total(events: Iterable[Event], cls: type[ev.Record], field: str) -> float:
    return sum((e.data[field] for e in _of(events, cls)), 0.0)


def run_stats(events: list[Event], learners: int, window_s: float) -> dict[str, Any]:
    """Every statistic this module computes, for a run of `learners` over `window_s`."""
    f = figures(events, learners)
    return {
        # the one definition (Figures); a stream without a join: over `window_s`
        "goodput": f.goodput() if f.window_s() else goodput(events, learners, window_s),
        **round_stats(events),
        "blocked_s": _total(events, ev.Blocked, "wait_s"),
        "down_s": _total(events, ev.Rejoined, "downtime_s"),
        "lost_work_s": _total(events, ev.Failed, "lost_steps_s"),
        "failures": len(_of(events, ev.Failed)),
        "refused": len(_of(events, ev.Refused)),
    }


def rejoin_times(events: list[Event]) -> tuple[list[float], float]:
    """Live runs: seconds from each learner restart to its first training step, and the
    total downtime (from each kill or crash to training again)."""
    out, down = [], 0.0
    kills: dict[str, float] = {}
    for e in events:
        if isinstance(e.data, ev.Chaos) and e.data.action == "kill":
            kills[e.data.process] = e.t
        if isinstance(e.data, ev.Crashed):
            kills.setdefault(e.data.process, e.t)
    for e in events:
        if not isinstance(e.data, ev.Restarted) or e.data.process == "syncer":
            continue
        lid, t = e.data.process, e.t
        nxt = next((x for x in _of(events, ev.Training) if x.source == lid and x.t > t), None)
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
        if isinstance(e.data, ev.Lost):
            lost.setdefault(e.data.learner, e.t)
        elif isinstance(e.data, Joined):
            lid, now = e.data.learner, e.data.incarnation
            was = inc.get(lid)
            if was is not None and was[0] == now:
                continue
            if was is not None:
                out.append(round(e.t - lost.get(lid, was[1]), 3))
            inc[lid] = (now, e.t)
            lost.pop(lid, None)
    return out


# -- the run's figures: one fold, read by every surface ----------------------------------------
@dataclass
class Figures:
    """The run's figures, folded from its event stream in stream order; every surface of a
    live run (the terminal view, the status page, /status.json, /metrics, /history.json, the
    report, TensorBoard and W&B, summary.json) shows these, so that they agree.

    tokens      the sum over learner incarnations of the most tokens each reported: from the
                learners' `step` events, or what the syncer's books heard (`heard_tokens`,
                the count the token budget is held to; it wins where both are known)
    rounds      merges (`round_closed`); a shard set's: the sum over its shards
    received_bytes / accepted / useful_s   contribution bytes, contributions and their
                step-seconds the syncer accepted (`accepted`)
    goodput     useful_s / (learners x the training window), the window running from the
                first join the syncer logged to the latest contribution it accepted. While
                the run is idle or over the figure holds (it never decays with the clock);
                a learner that trains but whose work never arrives lowers it at the next
                contribution taken.
    """

    learners: int = 1
    tokens: dict[str, int] = field(default_factory=dict)
    heard_tokens: int | None = None
    rounds: int = 0
    accepted: int = 0
    received_bytes: int = 0
    useful_s: float = 0.0
    start: float | None = None  # the first join
    last_accepted: float | None = None

    def feed(self, e: Event) -> None:
        d = e.data
        match d:
            case Accepted():
                self.accepted += 1
                self.received_bytes += d.bytes
                self.useful_s += d.work_s
                self.last_accepted = (
                    e.t if self.last_accepted is None else max(self.last_accepted, e.t)
                )
            case RoundClosed():
                self.rounds += 1
            case Joined():
                self.start = e.t if self.start is None else min(self.start, e.t)
            case Step():
                key = f"{e.source}/{d.incarnation}"
                self.tokens[key] = max(self.tokens.get(key, 0), d.tokens)

    def total_tokens(self) -> int:
        if self.heard_tokens is not None:
            return self.heard_tokens
        return sum(self.tokens.values())

    def window_s(self) -> float | None:
        """The training window: the first join to the latest contribution accepted."""
        if self.start is None or self.last_accepted is None:
            return None
        return max(self.last_accepted - self.start, 0.0)

    def goodput(self) -> float:
        w = self.window_s()
        return 0.0 if not w else goodput_of(self.useful_s, max(self.learners, 1), w)

    def as_dict(self) -> dict[str, Any]:
        """The figures every surface reports, by their names in /status.json."""
        return {
            "tokens": self.total_tokens(),
            "rounds": self.rounds,
            "accepted": self.accepted,
            "bytes_in": self.received_bytes,
            "useful_s": self.useful_s,
            "goodput": self.goodput(),
            "window_s": self.window_s() or 0.0,
            "first_join": self.start,
            "last_accepted": self.last_accepted,
        }


def figures(events: Iterable[Event], learners: int) -> Figures:
    """The figures of a whole stream."""
    f = Figures(learners)
    for e in events:
        f.feed(e)
    return f


def combine_figures(parts: list[Figures], learners: int) -> Figures:
    """A shard set's figures from its shards': sums, the earliest join, the latest
    contribution; tokens are the home shard's (the first), which counts the budget."""
    out = Figures(learners)
    for f in parts:
        out.rounds += f.rounds
        out.accepted += f.accepted
        out.received_bytes += f.received_bytes
        out.useful_s += f.useful_s
        out.start = min((t for t in (out.start, f.start) if t is not None), default=None)
        out.last_accepted = max(
            (t for t in (out.last_accepted, f.last_accepted) if t is not None), default=None
        )
    if parts:
        out.tokens, out.heard_tokens = dict(parts[0].tokens), parts[0].heard_tokens
    return out
