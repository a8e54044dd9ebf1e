"""The summary of a live run, from its run directory (events.jsonl, syncer_final.json and
final.safetensors). Keys follow the virtual-time driver's RunResult where they apply."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from atoll.live.config import LiveConfig
from atoll.live.eventlog import read_events
from atoll.sim.config import SimConfig


def evaluate(run_dir: Path, scfg: SimConfig) -> float:
    from safetensors.torch import load_file

    from atoll.sim.world import Evaluator, corpus_for

    path = run_dir / "final.safetensors"
    if not path.exists():
        return float("nan")
    return Evaluator(scfg, corpus_for(scfg))(load_file(str(path)))


def rejoin_times(events: list[dict[str, Any]]) -> tuple[list[float], float]:
    """Seconds from each learner restart to its first training step, and total downtime
    (from each kill to training again)."""
    out, down = [], 0.0
    kills: dict[str, float] = {}
    for e in events:
        d = e["data"]
        if e["kind"] == "chaos" and d.get("action") == "kill":
            kills[d["process"]] = e["t"]
        if e["kind"] == "crashed":
            kills.setdefault(d["process"], e["t"])
    for e in events:
        if e["kind"] != "restarted" or e["data"]["process"] == "syncer":
            continue
        lid, t = e["data"]["process"], e["t"]
        nxt = next(
            (x for x in events if x["kind"] == "training" and x["source"] == lid and x["t"] > t),
            None,
        )
        if nxt is not None:
            out.append(round(nxt["t"] - t, 3))
            if lid in kills:
                down += nxt["t"] - kills.pop(lid)
    return out, down


def summarize(
    run_dir: Path, scfg: SimConfig, lcfg: LiveConfig, start: float, end: float
) -> dict[str, Any]:
    from atoll.sim.world import ring_allreduce_bytes

    events = read_events(run_dir / "events.jsonl")
    final_path = run_dir / "syncer_final.json"
    acct = json.loads(final_path.read_text()) if final_path.exists() else {}
    rounds = [e for e in events if e["kind"] == "round_closed"]
    parts = [len(e["data"]["participants"]) for e in rounds]
    stale = [s for e in rounds for s in e["data"]["staleness"]]
    hist: dict[str, int] = {}
    for n in parts:
        hist[str(n)] = hist.get(str(n), 0) + 1
    tokens = int(sum(acct.get("tokens", {}).values()))
    training = [e["t"] for e in events if e["kind"] == "training"]
    train_start = min(training) if training else start
    window = max(end - train_start, 1e-9)
    M = scfg.learners
    from atoll.live.common import builtin_plan

    plan, _ = builtin_plan(scfg)
    dp_steps = tokens / (M * scfg.batch * scfg.context)
    rejoins, down = rejoin_times(events)
    chaos = [e for e in events if e["kind"] == "chaos"]
    return {
        "name": "live",
        "method": "decoupled_live",
        "eval_loss": evaluate(run_dir, scfg) if lcfg.eval else float("nan"),
        "tokens": tokens,
        "token_budget": scfg.token_budget(),
        "wall_time_s": end - start,
        "training_window_s": window,
        "goodput": min(acct.get("useful_s", 0.0) / (M * window), 1.0),
        "bytes_up": int(acct.get("bytes_in", 0)),
        "bytes_down": int(acct.get("bytes_out", 0)),
        "dp_bytes": int(dp_steps * M * ring_allreduce_bytes(plan.nbytes_fp32(), M)),
        "rounds": len(rounds),
        "participants_mean": sum(parts) / max(len(parts), 1),
        "participants_hist": hist,
        "staleness_mean": sum(stale) / max(len(stale), 1),
        "staleness_max": max(stale, default=0),
        "down_s": down,
        "failures": sum(1 for e in chaos if e["data"]["process"] != "syncer"),
        "syncer_kills": sum(1 for e in chaos if e["data"]["process"] == "syncer"),
        "rejoin_times_s": rejoins,
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
