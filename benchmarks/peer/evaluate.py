"""A run's numbers, after it ended (nothing here runs while learners train): the global
models kept during the run evaluated on the held-out bytes, tokens over time from the learners'
progress files, goodput, and the bytes on the learners' interfaces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import workload as wl

EVAL_POINTS = 14  # global models evaluated per run (evenly spread, the last one always)


def progress(rd: Path) -> list[dict]:
    """Every step line of every learner's progress file, in time order."""
    lines = []
    for f in sorted(rd.glob("progress-*.jsonl")):
        rank = int(f.stem.split("-")[1])
        for raw in f.read_text().splitlines():
            try:
                d = json.loads(raw)
            except ValueError:
                continue
            d["rank"] = rank
            lines.append(d)
    return sorted(lines, key=lambda d: d["t"])


def tokens_at(steps: list[dict], t: float) -> int:
    """Tokens all learners had trained by time t (a restarted learner's count continues)."""
    last: dict[int, int] = {}
    for d in steps:
        if d["t"] > t:
            break
        last[d["rank"]] = d["tokens"]
    return sum(last.values())


def pick(files: list[Path], n: int) -> list[Path]:
    if len(files) <= n:
        return files
    idx = sorted({round(k * (len(files) - 1) / (n - 1)) for k in range(n)})
    return [files[i] for i in idx]


def evaluate_run(system: Any, rd: Path, r: dict) -> dict:
    w = system.w
    torch.set_num_threads(2)
    _, held = wl.corpus()
    model = wl.build_model(w)
    lines = progress(rd)
    steps = [d for d in lines if "step" in d]
    saves = sorted((rd / "global").glob("*.*"), key=lambda p: float(p.stem))
    curve = []
    for f in pick(saves, EVAL_POINTS):
        model.load_state_dict(system.params(f, rd))
        t = float(f.stem)
        curve.append({"t": t - r["t0"], "tokens": tokens_at(steps, t),
                      "eval_loss": wl.evaluate(model, held, w)})  # fmt: skip
    trained = sum(max((d["tokens"] for d in steps if d["rank"] == k), default=0)
                  for k in {d["rank"] for d in steps})  # fmt: skip
    compute = sum(d.get("c", 0.0) for d in steps)
    frac = system.committed(rd, trained)
    link = r.get("link_bytes")
    out = {
        "curve": curve,
        "final_eval": curve[-1]["eval_loss"] if curve else float("nan"),
        "tokens_trained": trained,
        "compute_s": compute,
        "committed_frac": frac,
        # the learners' compute seconds that reached the global model, over M learners' wall
        "goodput": compute * frac / (w.learners * r["wall_s"]),
    }
    if link:
        out["link_total"] = {
            "tx": sum(d["tx_bytes"] for d in link),
            "rx": sum(d["rx_bytes"] for d in link),
        }
    return out
