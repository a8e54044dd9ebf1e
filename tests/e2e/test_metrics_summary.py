"""`/metrics` of a syncer agrees with the run's summary: a syncer started by hand with
--http-port, two learners that train to the token budget and leave, then /metrics parsed with
prometheus_client's parser against `atoll.live.summary.summarize` of the run directory (what
`atoll run` writes as summary.json): rounds, bytes each way, goodput, and the latest held-out
loss against the last `evaluated` event."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from atoll.config import load_job
from atoll.eventlog import load_events
from atoll.live.summary import summarize
from tests.e2e.test_status_page import _free_port
from tests.helpers import RUN, SECRET, syncer_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "ATOLL_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
SETS = ["--set", "learners=2", "--set", "steps=150", "--set", "eval=true"]


def test_metrics_agree_with_the_runs_summary(tmp_path):
    http = _free_port()
    start = time.time()
    # --serve-after-budget: /metrics is read once the learners have left
    argv = ["--http-port", str(http), "--serve-after-budget", *SETS]
    proc, addr = syncer_process(tmp_path, argv, ENV, ROOT)
    try:
        learners = []
        for i in range(2):
            cmd = [sys.executable, "-m", "atoll.cli", "learner", *SETS, "--syncer", addr,
                   "--index", str(i), "--run-id", RUN,
                   "--events", str(tmp_path / "events.jsonl")]  # fmt: skip
            log = open(tmp_path / f"L{i}.log", "wb")  # noqa: SIM115 - the process writes it
            learners.append(subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=log, stderr=log))
        for p in learners:  # both train to the budget and leave
            assert p.wait(240) == 0, (tmp_path / "L0.log").read_text()[-3000:]
        time.sleep(1.5)  # the last evaluation point, taken on the syncer's own thread
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    m = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    job = load_job([s for s in SETS if s != "--set"], None)
    s = summarize(tmp_path, job.sim, job.live, start, time.time())
    assert m["atoll_syncer_rounds_total"] == s["rounds"] > 0
    assert m["atoll_syncer_received_bytes_total"] == s["bytes_up"] > 0
    assert m["atoll_syncer_sent_bytes_total"] == s["bytes_down"] > 0
    assert m["atoll_syncer_tokens_total"] == s["tokens"] >= s["token_budget"]
    # the same fold (metrics.Figures): the same useful seconds over the same window
    assert m["atoll_syncer_goodput_ratio"] == pytest.approx(s["goodput"], abs=1e-3)
    evals = [e.data for e in load_events(tmp_path / "events.jsonl") if e.kind == "evaluated"]
    assert evals and m["atoll_syncer_eval_loss"] == evals[-1].eval_loss
    assert evals[-1].tokens >= s["token_budget"]  # the last point: the budget spent
