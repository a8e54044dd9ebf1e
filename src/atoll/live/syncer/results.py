"""A syncer's results at the end of its run: the final model, RUN_DIR/syncer_final.json (the
books, with the rounds, versions and the rejoins the syncer saw), and for a whole run (an
unsharded syncer, or a shard set's supervisor) RUN_DIR/summary.json (the same keys as `atoll
run`'s: live/summary.py) and RUN_DIR/report.html (`atoll report`'s writer)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from atoll import metrics
from atoll.eventlog import load_events


def write_json(path: Path, data: Any) -> None:
    """Atomically: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def final_books(service: Any, events: Path) -> dict[str, Any]:
    """The books at the end (`final_accounts`), with the rejoins of the run's event log."""
    rejoins = metrics.syncer_rejoins(load_events(events)) if events.exists() else []
    return {**service.final_accounts(), "rejoins": len(rejoins), "rejoin_times_s": rejoins}


def write_model(service: Any, run_dir: Path) -> None:
    """The global model as it is now, to RUN_DIR/final.safetensors (a run that serves on
    after its budget; at the stop `SyncerService.stop` writes it with every round closed)."""
    from safetensors.torch import save_file

    with service.lock:
        params = {k: v.contiguous() for k, v in service.proto.global_params().items()}
    tmp = run_dir / "final.safetensors.tmp"
    save_file(params, str(tmp))
    os.replace(tmp, run_dir / "final.safetensors")


def write_run_results(run_dir: Path, job: Any, custom: bool, start: float, end: float) -> None:
    """summary.json and report.html of the run in `run_dir` (its syncer_final.json, model and
    events written). A custom model's held-out loss is not the built-in evaluator's: NaN."""
    from atoll.live.summary import write_summary
    from atoll.report import try_report

    live = dataclasses.replace(job.live, eval=False) if custom else job.live
    write_summary(run_dir, job.sim, live, start, end)
    print(f"atoll syncer: the run is over: {run_dir / 'summary.json'}", flush=True)
    try_report(run_dir)
