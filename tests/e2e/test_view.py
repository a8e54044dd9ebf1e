"""The live view of `atoll run`: a table redrawn in place under a pseudo-terminal, one row per
learner (its plain progress lines when stdout is a pipe: test_sinks.py, on the run that feeds
the sinks)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["-m", "atoll.cli", "run", "--set", "learners=2", "--set", "steps=80"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}


def test_the_view_renders_a_row_per_learner_under_a_terminal(tmp_path):
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, *ARGS, "--out", str(tmp_path / "r")], cwd=ROOT,
                            env=ENV, stdin=slave, stdout=slave, stderr=slave)  # fmt: skip
    os.close(slave)
    out = b""
    until = time.time() + 240
    while time.time() < until:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: the run ended
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    assert proc.wait(30) == 0, out[-3000:]
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))
    assert "learner" in text and "staleness" in text and "tokens/s" in text, text[-3000:]
    rows = re.findall(r"│ (L[01]) +│ (\w+) +│ +(\d+) │ +(\d+) │", text)  # learner state ranks step
    assert {r[0] for r in rows} == {"L0", "L1"}, text[-3000:]
    assert {r[2] for r in rows} == {"1"}  # one rank each (no islands here)
    assert max(int(r[3]) for r in rows) > 0  # the steps moved while it ran
    assert "rounds" in text and "goodput" in text
    # the global model's held-out loss while the run went (the syncer evaluates it)
    assert re.search(r"eval loss \(global model, held out\): \d+\.\d{4} at [\d,]+ tokens", text)
