"""The summary of a live run, from its run directory (events.jsonl, syncer_final.json and
final.safetensors). Keys follow the virtual-time driver's RunResult where they apply."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from atoll import metrics
from atoll.config import LiveConfig, SimConfig
from atoll.core.events import (
    Chaos,
    Crashed,
    Event,
    LinkBottleneck,
    Step,
    ThreadDied,
)
from atoll.eventlog import load_events


def evaluate(run_dir: Path, scfg: SimConfig) -> float:
    from safetensors.torch import load_file

    from atoll.model.recipe import load_corpus
    from atoll.model.train import Evaluator

    path = run_dir / "final.safetensors"
    if not path.exists():
        return float("nan")
    return Evaluator(scfg, load_corpus(scfg))(load_file(str(path)))


def wire_bytes(events: list[Event]) -> dict[str, int | None]:
    """Bytes on the wire up and down, summed over every learner incarnation's last report."""
    last: dict[tuple, tuple[int, int]] = {}
    for e in events:
        if isinstance(d := e.data, Step) and d.wire_up is not None:
            last[(e.source, d.incarnation)] = (d.wire_up, d.wire_down or 0)
    if not last:
        return {"wire_up": None, "wire_down": None}
    return {
        "wire_up": sum(v[0] for v in last.values()),
        "wire_down": sum(v[1] for v in last.values()),
    }


def books_tokens(run_dir: Path) -> int | None:
    """The run's tokens as the syncer's books (syncer_final.json) counted them, if written."""
    try:
        books = json.loads((run_dir / "syncer_final.json").read_text())
        return int(sum(books.get("tokens", {}).values()))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def summarize(
    run_dir: Path, scfg: SimConfig, lcfg: LiveConfig, start: float, end: float
) -> dict[str, Any]:
    from atoll.bandwidth.model import ring_allreduce_bytes
    from atoll.model.recipe import builtin_plan

    events = load_events(run_dir / "events.jsonl")
    final_path = run_dir / "syncer_final.json"
    acct = json.loads(final_path.read_text()) if final_path.exists() else {}
    tokens = books_tokens(run_dir) or 0
    M = scfg.learners
    # the run's figures (metrics.Figures, as every surface reads them): goodput over the first
    # join to the latest contribution taken (what follows - learners closing, the final
    # snapshot and model, processes exiting - is the run's teardown)
    stats = metrics.run_stats(events, M, max(end - start, 1e-9))
    window = metrics.figures(events, M).window_s() or 0.0
    plan, _ = builtin_plan(scfg)
    dp_steps = tokens / (M * scfg.batch * scfg.context)
    rejoins, down = metrics.rejoin_times(events)
    if not any(e.source == "launcher" for e in events):  # a hand-started syncer's run
        rejoins = metrics.syncer_rejoins(events)
    chaos = [e.data for e in events if isinstance(e.data, Chaos)]
    slow_links = {
        d.learner: round(d.upload_s, 3) for e in events if isinstance(d := e.data, LinkBottleneck)
    }
    return {
        "name": "live",
        "method": "decoupled_live",
        "eval_loss": evaluate(run_dir, scfg) if lcfg.eval else float("nan"),
        "tokens": tokens,
        "learners": M,
        "token_budget": scfg.budget_tokens(),
        "wall_time_s": end - start,
        "training_window_s": window,
        "goodput": stats["goodput"],
        "bytes_up": int(acct.get("bytes_in", 0)),
        "bytes_down": int(acct.get("bytes_out", 0)),
        # measured on the learners' own sockets (kernel TCP counters plus frame headers:
        # live/comm/wire.py), heartbeats, pulls and heals included; None where not measured
        **wire_bytes(events),
        # bytes a data-parallel ring all-reduce of fp32 gradients sends for these tokens
        "dp_bytes": int(dp_steps * M * ring_allreduce_bytes(plan.nbytes_fp32(), M)),
        **{k: stats[k] for k in ("rounds", "participants_mean", "participants_hist")},
        **{k: stats[k] for k in ("staleness_mean", "staleness_max")},
        "down_s": down,
        # learners whose uploads took longer than the tau-step overlap (their link set their
        # pace): learner -> average upload seconds when it was first seen
        "link_bottleneck": slow_links,
        "failures": sum(1 for c in chaos if c.process != "syncer"),
        "syncer_kills": sum(1 for c in chaos if c.process == "syncer"),
        "rejoin_times_s": rejoins,
        # processes that died on their own (a learner whose communication side or a thread
        # died exits non-zero: counted here and restarted), and the threads that died
        "crashes": sum(1 for e in events if isinstance(e.data, Crashed)),
        "threads_died": sum(1 for e in events if isinstance(e.data, ThreadDied)),
        "lost_committed_rounds": int(acct.get("lost_committed_rounds", 0)),
        "refused": int(acct.get("refused", 0)),
        "auth_refused": int(acct.get("auth_refused", 0)),
        "broken_transfers": int(acct.get("broken_transfers", 0)),
        "syncer_restarts": int(acct.get("restarts", 0)),
        "run_dir": str(run_dir),
        "settings": {
            **{k: v for k, v in dataclasses.asdict(scfg).items() if v != getattr(SimConfig(), k)},
            **{k: v for k, v in dataclasses.asdict(lcfg).items() if v != getattr(LiveConfig(), k)},
        },
    }


def write_summary(
    run_dir: Path, scfg: SimConfig, lcfg: LiveConfig, start: float, end: float
) -> dict[str, Any]:
    """`summarize`, written to RUN_DIR/summary.json (`atoll run`'s and `atoll syncer`'s)."""
    summary = summarize(run_dir, scfg, lcfg, start, end)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    return summary
