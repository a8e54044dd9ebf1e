"""The TensorBoard sink of `atoll run --tensorboard DIR`: event files that tensorboard's own
reader loads, with the run's figures, the same as the run's summary where both have them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_tensorboard_gets_the_runs_figures(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    cmd = [sys.executable, "-m", "atoll.cli", "run", "--set", "learners=2", "--set", "steps=60",
           "--out", str(tmp_path / "r"), "--tensorboard", str(tb), "--quiet"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    acc = EventAccumulator(str(tb))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"run/tokens", "run/rounds", "run/goodput", "run/eval_loss"} <= tags, tags
    assert {"learner/L0/tokens_per_s", "learner/L1/tokens_per_s"} <= tags
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    (loss,) = acc.Scalars("run/eval_loss")
    assert loss.value == pytest.approx(summary["eval_loss"], rel=1e-6)
    rounds = acc.Scalars("run/rounds")
    assert [s.value for s in rounds] == sorted(s.value for s in rounds)  # counts only grow
    assert rounds[-1].value == summary["rounds"]  # the last figures are the run's
    tokens = acc.Scalars("run/tokens")
    assert tokens[-1].value > 0 and tokens[-1].step == int(tokens[-1].value)


def test_a_missing_wandb_stops_with_one_line(tmp_path):
    try:
        import wandb  # noqa: F401

        pytest.skip("wandb is installed here")
    except ImportError:
        pass
    cmd = [sys.executable, "-m", "atoll.cli", "run", "--wandb", "proj", "--out", str(tmp_path)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "pip install wandb" in lines[0], lines
    assert not (tmp_path / "events.jsonl").exists()  # nothing started
