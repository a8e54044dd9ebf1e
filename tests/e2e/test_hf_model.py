"""A Hugging Face model, no glue: `atoll syncer --init-from examples.hf_causal_lm:build_model`
starts from the model itself (its tied embedding found in it), and the example trains it
through atoll.Learner in its own process: the loss falls, the syncer merges its fragments."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from atoll.eventlog import load_events
from atoll.live.client import status
from tests.helpers import RUN, SECRET, syncer_process

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 80


def test_the_example_trains_a_transformers_model_through_its_syncer(tmp_path):
    env = {**os.environ, "ATOLL_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
    sets = ["P=4", "H=4", "learners=1", "snapshot_every_s=60", "eval_every_s=2"]
    argv = ["--init-from", "examples.hf_causal_lm:build_model", "--no-budget"]
    argv += ["--eval-from", "examples.hf_causal_lm:build_eval"]  # the global model's loss
    proc, addr = syncer_process(tmp_path, argv + [x for s in sets for x in ("--set", s)], env, ROOT)
    try:
        cmd = [sys.executable, "examples/hf_causal_lm.py", "--syncer", addr, "--run-id", RUN,
               "--learner-id", "HF0", "--steps", str(STEPS)]  # fmt: skip
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        losses = [float(x) for x in re.findall(r"^step \d+ loss ([\d.]+)$", res.stdout, re.M)]
        assert len(losses) == STEPS, res.stdout[-2000:]
        early, late = sum(losses[:10]) / 10, sum(losses[-20:]) / 20
        assert late < early - 1.0, (early, late)  # from ~ln 256 = 5.5 to under 3.5 on bytes
        st = status(addr, RUN, SECRET)
        assert st.rounds >= STEPS // 2 and min(st.versions) >= STEPS // 8, st
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    # the syncer evaluated its global model every 2 s with the example's function: it fell
    evals = [e.data for e in load_events(tmp_path / "events.jsonl") if e.kind == "evaluated"]
    assert len(evals) >= 2, evals
    assert evals[-1].eval_loss < evals[0].eval_loss - 0.5, evals  # from ~ln 256 = 5.5
