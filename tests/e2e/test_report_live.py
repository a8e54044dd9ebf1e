"""`atoll report` on a tiny live run (`atoll run`: a syncer and two learner processes, one
killed and restarted by the supervisor)."""

import subprocess
import sys

import pytest

from tests.e2e.test_live import _sets
from tests.report_checks import assert_every_plot_drawn

pytestmark = pytest.mark.slow


def test_report_of_a_tiny_live_run_draws_every_plot(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "atoll.cli", "run", "--out", str(out), "--quiet",
           *_sets(["learners=2", "steps=300", "pace_s=0.02", "restart_delay_s=0.5",
                   "chaos=kill:L1@2+0.5"])]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    res = subprocess.run([sys.executable, "-m", "atoll.cli", "report", str(out)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == str(out / "report.html")
    assert_every_plot_drawn(out / "report.html")
    text = (out / "report.html").read_text()
    assert "summary.json written" in text and "L1" in text
