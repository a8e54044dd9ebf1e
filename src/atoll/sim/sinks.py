"""`atoll sim --tensorboard DIR / --wandb PROJECT`: each run of the preset to the sinks of
atoll.sinks, once it is done, under its name (DIR/RUN; a W&B run named RUN, grouped by the
output folder).

A Decoupled run's figures come from its event stream (`events-RUN.jsonl`), folded by the live
view's own RunState into the same names `atoll run` gives its sinks (atoll.sinks.scalars), at
up to POINTS instants of virtual time, keyed by the run's tokens; every run adds its held-out
loss at each point of its curve (`run/eval_loss`), and its last tokens and goodput.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from atoll.config import SimConfig
from atoll.core.events import Event
from atoll.eventlog import load_events

POINTS = 200  # figures per run at most (the live view: one per refresh)


def figures(run: dict, events: list[Event], learners: int) -> list[tuple[int, dict[str, float]]]:
    """(tokens, figures) in order of tokens, for one run of a preset's results (`events`: its
    stream, empty for a baseline)."""
    from atoll.live.view import RunState
    from atoll.sinks import scalars

    out: list[tuple[int, dict[str, float]]] = []
    end = run["wall_time_s"]
    if events:
        state = RunState(learners, 0, run["dp_bytes"] / max(run["tokens"], 1))
        state.started = 0.0  # virtual time: every learner starts at 0 (its goodput's window)
        due = 0.0
        for e in events:
            state.feed(e)
            if e.t >= due and e.t > 0:
                due = e.t + end / POINTS
                out.append((state.total_tokens(), scalars(state, e.t)))
        out.append((state.total_tokens(), scalars(state, end)))
    else:
        final = {"run/tokens": float(run["tokens"]), "run/goodput": run["goodput"]}
        out.append((run["tokens"], final))
    for c in run["curve"]:
        out.append((int(c["tokens"]), {"run/eval_loss": c["eval_loss"]}))
    return sorted(out, key=lambda x: x[0])  # stable: the last figures stay last


def write_runs(result: dict, out: Path, args: argparse.Namespace) -> None:
    """Every run of `result` (atoll.sim.runner.run_preset, its event streams in `out`) to the
    sinks `args` asks for."""
    from atoll.sinks import close_all, feed, open_sinks

    for run in result["runs"]:
        name = run["name"]
        path = out / f"events-{name}.jsonl"
        events = load_events(path) if path.exists() else []
        learners = run["settings"].get("learners", SimConfig().learners)
        tb = str(Path(args.tensorboard) / name) if args.tensorboard else None
        config = {**dataclasses.asdict(SimConfig()), **run["settings"], "preset": result["preset"]}
        sinks = open_sinks(tb, args.wandb, str(out), args.wandb_mode, name, out.name, config)
        for tokens, values in figures(run, events, learners):
            feed(sinks, tokens, values)
        close_all(sinks)
