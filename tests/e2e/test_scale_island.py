"""The scale benchmark's worker as a two-rank island (torchrun, gloo on the CPU, tiny sizes):
the path `benchmarks/gpu_check.sh --nproc 2` takes on GPUs. Its ranks agree on the steps they
take (rank 0 decides and broadcasts) and report the talking rank's counters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_scale_worker_runs_as_a_two_rank_island(tmp_path):
    out = tmp_path / "scale.json"
    cmd = [sys.executable, "benchmarks/scale.py", "--sizes", "1M", "--nproc", "2",
           "--steps", "2", "--repeats", "1", "--warmup", "2", "--min-block-s", "0",
           "--batch", "2", "--context", "32", "--train-cpus", "", "--comm-cpus", "",
           "--out", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    (row,) = json.loads(out.read_text())["sizes"]
    assert row["ranks"] == 2
    assert row["tokens_per_step"] == 2 * 2 * 32  # both ranks' tokens
    # the talking rank's counters: a full heal came down (int8: about a byte a value)
    assert row["heal_bytes_down"] > 0.9 * row["params"]
    assert row["bytes_down"] >= row["heal_bytes_down"]
    # every block of each side took the steps rank 0 decided
    assert [len(b) for b in row["plain_blocks"] + row["atoll_blocks"]] == [2, 2]
