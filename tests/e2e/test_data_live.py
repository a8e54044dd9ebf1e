"""`atoll run` on a user's token file: the learner processes memory-map it themselves (the
launcher copies nothing), train on it, and the summary evaluates on its held-out file."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_a_live_run_trains_on_a_token_file(tmp_path):
    rng = np.random.default_rng(0)  # runs of consecutive ids: each id predicts the next
    runs = [np.arange(s, s + 40) % 300 for s in rng.integers(0, 300, 1500)]
    np.concatenate(runs).astype(np.uint16).tofile(tmp_path / "train.bin")
    np.concatenate(runs[:50]).astype(np.uint16).tofile(tmp_path / "val.bin")
    out = tmp_path / "run"
    sets = {
        "data": tmp_path / "train.bin",
        "eval_data": tmp_path / "val.bin",
        "vocab": 300,
        "learners": 2,
        "steps": 100,
        "n_layer": 1,
        "d_model": 32,
        "n_head": 2,
        "context": 16,
        "batch": 4,
        "P": 4,
        "H": 4,
        "eval_batches": 2,
        "lr": 0.01,
        "warmup": 5,
        # steps of a few ms: the whole run lasts about a heartbeat. Each learner stops on its
        # share of what its last answer said was left (remaining / live learners); a slower
        # learner that has not heard, before its share runs out, that a faster one finished
        # stops short of the budget. Answers every 50 ms keep its share current.
        "heartbeat_s": 0.05,
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    cmd = [sys.executable, "-m", "atoll.cli", "run", "--out", str(out), "--quiet", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["tokens"] >= s["token_budget"] == 2 * 100 * 4 * 16, s
    assert s["eval_loss"] < math.log(300) - 1.5, s  # on val.bin; untrained: ln 300 = 5.7
    assert not (out / "corpus.bin").exists()  # each learner maps the token file itself
