"""A run directory read into plain series for `atoll report`.

Two layouts: a live run (`atoll run`, `atoll demo`, or a hand-started syncer): events.jsonl,
with summary.json once the launcher has finished; and `atoll sim --out DIR`: results.json (every
method's loss curve) and events-RUN.jsonl for each Decoupled run. Times on every plot are seconds
from the stream's first event (wall-clock in a live run, virtual in the simulator).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atoll import metrics
from atoll.core import events as ev
from atoll.core.events import FINISHED, Event
from atoll.errors import ConfigError
from atoll.eventlog import load_events

EXPECTED = "a run directory holding events.jsonl (atoll run / syncer) or results.json (atoll sim)"


@dataclass
class Curve:
    """Held-out loss of one method against tokens and seconds (one point for a live run)."""

    name: str
    tokens: list[float]
    time_s: list[float]
    loss: list[float]


@dataclass
class RunData:
    kind: str  # "live" or "sim"
    run_dir: Path
    header: dict[str, str]
    curves: list[Curve] = field(default_factory=list)
    streams: dict[str, list[Event]] = field(default_factory=dict)  # run name -> its events
    learners: int | None = None  # goodput's learners (a live run's setting, where known)


def read_run(run_dir: str | Path) -> RunData:
    d = Path(run_dir)
    if not d.is_dir():
        raise ConfigError("RUN_DIR", str(d), EXPECTED + "; there is no such directory")
    try:
        if (d / "results.json").exists():
            return _read_sim(d)
        if (d / "events.jsonl").exists():
            return _read_live(d)
    except (OSError, ValueError) as exc:
        raise ConfigError("RUN_DIR", str(d), f"{EXPECTED}; reading it failed: {exc}") from exc
    raise ConfigError("RUN_DIR", str(d), EXPECTED + "; it holds neither")


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def _read_sim(d: Path) -> RunData:
    result = json.loads((d / "results.json").read_text())
    runs = result["runs"]
    curves = [
        Curve(
            r["name"],
            [c["tokens"] for c in r["curve"]],
            [c["time_s"] for c in r["curve"]],
            [c["eval_loss"] for c in r["curve"]],
        )
        for r in runs
        if r.get("curve")
    ]
    streams = {}
    for r in runs:
        path = d / f"events-{r['name']}.jsonl"
        if path.exists():
            streams[r["name"]] = load_events(path)
    main = next((r for r in runs if r["method"] == "decoupled"), runs[0])
    header = {
        "run kind": f"sim (atoll sim --preset {result['preset']}, seed {result['seed']})",
        "runs": ", ".join(f"{r['name']} ({r['method']})" for r in runs),
        "learners": str(main["settings"].get("learners", 4)),
        "tokens": f"{main['tokens']:,}",
        "goodput": f"{100 * main['goodput']:.1f}% ({main['name']})",
        "rounds": str(main["rounds"]),
        "bytes up / down": f"{_mb(main['bytes_up'])} / {_mb(main['bytes_down'])}",
    }
    return RunData("sim", d, header, curves, streams)


def _read_live(d: Path) -> RunData:
    events = load_events(d / "events.jsonl")
    s_path = d / "summary.json"
    s = json.loads(s_path.read_text()) if s_path.exists() else None
    learners = learner_ids(events)
    if s is not None:
        header = {
            "run kind": "live (summary.json written: the run has ended)",
            "learners": _learners(learners, events),
            "tokens": f"{s['tokens']:,} of {s['token_budget']:,}",
            "goodput": f"{100 * s['goodput']:.1f}%",
            "rounds": str(s["rounds"]),
            "bytes up / down": f"{_mb(s['bytes_up'])} / {_mb(s['bytes_down'])}",
            "eval loss": f"{s['eval_loss']:.4f}",
        }
    else:  # a hand-started syncer, or a run still going: what the events say so far
        f = metrics.figures(events, learner_count(events, None))
        w = f.window_s()
        header = {
            "run kind": "live (no summary.json: a hand-started syncer or a run still going)",
            "learners": _learners(learners, events),
            "tokens": f"{f.total_tokens():,}" if f.tokens else "- (the learners log elsewhere)",
            "goodput": f"{100 * f.goodput():.1f}% over {w:.0f} s" if w else "-",
            "rounds": str(f.rounds),
            "bytes received": _mb(f.received_bytes),
        }
        if evals := _evals(events):
            e = evals[-1].data
            header["eval loss"] = f"{e.eval_loss:.4f} at {e.tokens:,} tokens (the latest)"
    curves = [live_curve(events, s)] if s is not None or _evals(events) else []
    if s is not None and math.isfinite(s.get("eval_loss", math.nan)):
        if "sim_eval_loss" in s:  # --compare-sim: the virtual-time driver's loss, same tokens
            curves.append(Curve("virtual-time", [s["sim_tokens"]], [], [s["sim_eval_loss"]]))
    return RunData("live", d, header, curves, {"live": events}, learner_count(events, s))


def _learners(ids: list[str], events: list[Event]) -> str:
    """How many learners, and the ranks of each island among them (from `training`)."""
    ranks = {e.source: e.data.island for e in events if isinstance(e.data, ev.Training)}
    islands = [f"{lid} {ranks[lid]} ranks" for lid in ids if ranks.get(lid, 1) > 1]
    return f"{len(ids)}" + (f" (islands: {', '.join(islands)})" if islands else "")


def _evals(events: list[Event]) -> list[Event]:
    return [e for e in events if isinstance(e.data, ev.Evaluated)]


def live_curve(events: list[Event], summary: dict[str, Any] | None) -> Curve:
    """The global model's held-out loss as the syncer evaluated it while the run went
    (`evaluated` events), then the final model's from the summary, where it has one."""
    t0, evals = _t0(events), _evals(events)
    c = Curve(
        "live",
        [e.data.tokens for e in evals],
        [e.t - t0 for e in evals],
        [e.data.eval_loss for e in evals],
    )
    s = summary or {}
    if math.isfinite(s.get("eval_loss", math.nan)):
        acc = [e.t for e in events if isinstance(e.data, ev.Accepted)]
        end = max(acc, default=t0 + s["wall_time_s"])
        c.tokens.append(s["tokens"])
        c.time_s.append(end - t0)
        c.loss.append(s["eval_loss"])
    return c


# -- series from one event stream ---------------------------------------------------------------
def learner_ids(events: list[Event]) -> list[str]:
    ids = {e.data.learner for e in events if isinstance(e.data, (ev.Joined, ev.Accepted))}
    ids |= {p for e in rounds(events) for p in e.data.participants}
    return sorted(ids)


def _t0(events: list[Event]) -> float:
    return min((e.t for e in events), default=0.0)


def learner_count(events: list[Event], summary: dict[str, Any] | None) -> int:
    """The learners goodput is counted over: the run's setting where the summary has it, else
    every learner the stream names."""
    if summary and summary.get("learners"):
        return int(summary["learners"])
    return max(len(learner_ids(events)), 1)


def goodput_series(
    events: list[Event], learners: int | None = None, points: int = 40
) -> tuple[list[float], list[float]]:
    """Goodput (metrics.Figures: accepted step-seconds / (learners x the first join to the
    latest contribution)) at `points` times, the last at the latest contribution: the run's
    figure."""
    m = learners or learner_count(events, None)
    acc = [e.t for e in events if isinstance(e.data, ev.Accepted)]
    if not acc:
        return [], []
    t0, f = _t0(events), metrics.Figures(m)
    it = iter(sorted(events, key=lambda e: e.t))
    start = min((e.t for e in events if isinstance(e.data, ev.Joined)), default=t0)
    xs, ys = [], []
    pending = next(it, None)
    for i in range(1, points + 1):
        t = start + (acc[-1] - start) * i / points
        while pending is not None and pending.t <= t:
            f.feed(pending)
            pending = next(it, None)
        if f.window_s():
            xs.append(t - t0)
            ys.append(f.goodput())
    return xs, ys


def rounds(events: list[Event]) -> list[Event]:
    return [e for e in events if isinstance(e.data, ev.RoundClosed)]


def participation(events: list[Event]) -> tuple[list[str], list[list[int]]]:
    """Learners (rows) x merged rounds (columns): 1 where the learner's contribution merged."""
    ids = learner_ids(events)
    cols = [set(e.data.participants) for e in rounds(events)]
    return ids, [[int(lid in c) for c in cols] for lid in ids]


def round_bytes(events: list[Event]) -> tuple[list[int], list[int]]:
    """Bytes per merged round: contributions in, the update out."""
    rs = rounds(events)
    return [e.data.bytes_in for e in rs], [e.data.bytes_out for e in rs]


def staleness(events: list[Event]) -> tuple[list[float], list[float], list[int]]:
    """Per merged round: its time (s), and the mean and max staleness of its contributions."""
    t0, xs, mean, top = _t0(events), [], [], []
    for e in rounds(events):
        st = list(e.data.staleness) or [0]
        xs.append(e.t - t0)
        mean.append(sum(st) / len(st))
        top.append(max(st))
    return xs, mean, top


# what each marker on the timeline means, by event class
DOWN = (ev.Failed, ev.Crashed, ev.Lost, ev.Chaos)
UP = (ev.Rejoined, ev.Restarted, ev.Joined, ev.Restored)


def timeline(events: list[Event]) -> dict[str, list[tuple[str, float]]]:
    """Failures and rejoins: 'down' / 'up' -> [(process, seconds)]."""
    t0 = _t0(events)
    out: dict[str, list[tuple[str, float]]] = {"down": [], "up": []}
    for e in events:
        who = _who(e)
        if who is None:
            continue
        if isinstance(e.data, ev.Lost) and e.data.why == FINISHED:
            continue  # a finish (its final beat came first), not a failure
        if isinstance(e.data, DOWN):
            out["down"].append((who, e.t - t0))
        elif isinstance(e.data, UP):
            out["up"].append((who, e.t - t0))
    return out


def _who(e: Event) -> str | None:
    match e.data:
        case ev.Chaos() | ev.Crashed() | ev.Restarted():
            return e.data.process
        case ev.Joined() | ev.Lost():
            return e.data.learner
        case ev.Failed() | ev.Rejoined():
            return e.source
        case ev.Restored():
            return "syncer"
    return None
