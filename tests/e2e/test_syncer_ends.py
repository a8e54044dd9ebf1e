"""A hand-started syncer with a token budget ends by itself: two learners train to the budget
and leave, and the syncer exits 0 having written the final model, summary.json with `atoll
run`'s keys (rejoins included), report.html and syncer_final.json with its rejoins; without a
budget, --serve-after-budget warns once. A tiny model and few steps: the run itself takes a few
seconds. A shard set that ends by itself: tests/e2e/test_shards.py; --serve-after-budget writing
the results and serving on, plain and sharded: tests/e2e/test_figures_agree.py."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from pathlib import Path

import pytest

from atoll.config import load_job
from atoll.live.summary import summarize
from tests.helpers import SECRET, learner_process, syncer_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "ATOLL_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
TINY = ["learners=2", "steps=30", "n_layer=1", "d_model=16", "n_head=2", "context=16", "batch=4",
        "P=4", "H=4", "data_bytes=200000", "eval_batches=2", "eval_points=1"]  # fmt: skip
SETS = [x for kv in TINY for x in ("--set", kv)]


def _learner(addr: str, index: int, run_dir: Path) -> subprocess.Popen:
    return learner_process(addr, index, run_dir, SETS, ENV, ROOT)


def _run(run_dir: Path, extra: list[str]) -> str:
    """The syncer and two learners; returns the syncer's output once it has ended by itself."""
    proc, addr = syncer_process(run_dir, [*extra, "--view", "off", *SETS], ENV, ROOT)
    learners = [_learner(addr, i, run_dir) for i in range(2)]
    try:
        for i, p in enumerate(learners):
            assert p.wait(180) == 0, (run_dir / f"L{i}.log").read_text()[-3000:]
        out = proc.communicate(timeout=120)[0].decode()  # nobody stops it: it ends
    finally:
        for p in [proc, *learners]:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert proc.returncode == 0, out[-3000:]
    return out


def _check_results(run_dir: Path, out: str) -> None:
    job = load_job(TINY, None)
    summary = json.loads((run_dir / "summary.json").read_text())
    keys = summarize(run_dir, job.sim, job.live, 0.0, 1.0).keys()  # `atoll run`'s summary
    assert summary.keys() == keys
    assert summary["tokens"] >= summary["token_budget"] == job.sim.budget_tokens()
    assert summary["rounds"] > 0 and summary["rejoin_times_s"] == []
    assert math.isfinite(summary["eval_loss"])  # the built-in model's final model, evaluated
    final = json.loads((run_dir / "syncer_final.json").read_text())
    assert final["rejoins"] == 0 and final["rejoin_times_s"] == []
    assert (run_dir / "final.safetensors").stat().st_size > 0
    assert "<html" in (run_dir / "report.html").read_text()[:200].lower()
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    over = [e["data"] for e in events if e["kind"] == "run_over"]
    assert over and all(o["reason"] == "flushed" for o in over), over
    assert "the run is over" in out


def test_a_hand_started_syncer_with_a_budget_ends_and_writes_the_runs_results(tmp_path):
    out = _run(tmp_path, [])
    _check_results(tmp_path, out)


def test_serve_after_budget_without_a_budget_warns_once(tmp_path):
    proc, _ = syncer_process(tmp_path, ["--serve-after-budget", "--no-budget", *SETS], ENV, ROOT)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0].decode()
    warned = [ln for ln in out.splitlines() if "--serve-after-budget" in ln]
    assert proc.returncode == 0 and len(warned) == 1 and "warning" in warned[0], out
