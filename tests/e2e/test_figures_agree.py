"""Every surface of a live run shows the same figures once it has ended, a plain syncer and a
shard set of 2 alike: the syncer's last plain view line, /status.json, /metrics, summary.json,
syncer_final.json, the report's data and the figures the TensorBoard/W&B sinks are given
agree on tokens, rounds and bytes, on goodput within 0.1 point (metrics.Figures is the one
fold they read; docs/live.md "One set of figures"), and on the last held-out loss.

The syncer serves on after its run is over (`--serve-after-budget`), so that the HTTP surfaces
are read once it has written summary.json and the report: the run has ended."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from atoll.config import load_job
from atoll.eventlog import load_events
from atoll.live.address import free_port
from atoll.live.view import RunState
from atoll.report.data import goodput_series, read_run
from atoll.sinks import scalars
from tests.e2e.test_status_page import ENV, ROOT
from tests.helpers import learner_process, syncer_process

pytestmark = pytest.mark.slow

SETS = ["--set", "learners=2", "--set", "steps=40"]  # a few dozen rounds: enough to compare

LINE = re.compile(
    r"tokens (?P<tokens>[\d,]+)/[\d,]+  rounds (?P<rounds>\d+) .*goodput (?P<goodput>[\d.]+)%"
    r"  received (?P<mb>[\d.]+) MB"
)


def _learner(addr: str, index: int, run_dir: Path) -> subprocess.Popen:
    return learner_process(addr, index, run_dir, SETS, ENV, ROOT)


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.read().decode()


def _run(run_dir: Path, extra: list[str]) -> tuple[dict, dict, str]:
    """A syncer (`extra`: its own flags) and two learners to the budget: (/status.json, the
    set's or syncer's own /metrics samples without a shard label, the syncer's output)."""
    http = free_port()
    flags = ["--http-port", str(http), "--serve-after-budget", *SETS, *extra]
    proc, addr = syncer_process(run_dir, flags, ENV, ROOT)
    learners = []
    try:
        learners = [_learner(addr, i, run_dir) for i in range(2)]
        for i, p in enumerate(learners):  # both train to the budget and leave
            assert p.wait(240) == 0, (run_dir / f"L{i}.log").read_text()[-3000:]
        until = time.time() + 60  # the run is over: summary.json, then report.html written
        while not (run_dir / "report.html").exists():
            assert time.time() < until, _get(http, "/status.json")
            time.sleep(0.3)
        status = json.loads(_get(http, "/status.json"))
        assert status["learners_live"] == 0, status["learners"]
        assert proc.poll() is None  # and it serves on
        text = _get(http, "/metrics")
    finally:
        for p in learners:
            if p.poll() is None:
                p.kill()
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0].decode()
    metrics = {s.name: s.value for f in text_string_to_metric_families(text)
               for s in f.samples if "shard" not in s.labels}  # fmt: skip
    return status, metrics, out


@pytest.mark.parametrize("shards", [1, 2], ids=["plain", "shards"])
def test_every_surface_shows_the_same_figures_at_the_end(tmp_path, shards):
    status, m, out = _run(tmp_path, ["--shards", "2"] if shards > 1 else [])
    job = load_job([s for s in SETS if s != "--set"], None)
    summary = json.loads((tmp_path / "summary.json").read_text())  # the syncer's own
    final = json.loads((tmp_path / "syncer_final.json").read_text())
    lines = [x for x in map(LINE.search, out.splitlines()) if x]
    assert lines, out[-3000:]
    view = lines[-1]  # the last plain line: the figures at the end
    report = read_run(tmp_path)
    events = load_events(tmp_path / "events.jsonl")
    state = RunState(job.sim.learners, job.sim.budget_tokens())  # what the sinks are given
    for e in events:
        state.feed(e)
    state.heard([], time.time(), 1.0, status["tokens"])
    sink = scalars(state, time.time())

    tokens = status["tokens"]
    assert tokens >= job.sim.budget_tokens() and tokens == summary["tokens"]
    assert int(view["tokens"].replace(",", "")) == m["atoll_syncer_tokens_total"] == tokens
    assert sum(final["tokens"].values()) == sink["run/tokens"] == tokens
    assert report.header["tokens"].startswith(f"{tokens:,} of")

    rounds = status["rounds"]
    assert rounds > 0 and int(view["rounds"]) == m["atoll_syncer_rounds_total"] == rounds
    assert summary["rounds"] == final["rounds"] == sink["run/rounds"] == rounds
    assert report.header["rounds"] == str(rounds)

    received, sent = status["bytes_in"], status["bytes_out"]
    assert received > 0 and sent > 0
    assert m["atoll_syncer_received_bytes_total"] == summary["bytes_up"] == final["bytes_in"]
    assert m["atoll_syncer_sent_bytes_total"] == summary["bytes_down"] == final["bytes_out"]
    assert (final["bytes_in"], final["bytes_out"]) == (received, sent)
    assert float(view["mb"]) == pytest.approx(received / 1e6, abs=0.006)
    assert state.fig.received_bytes == received  # the stream's accepted contributions

    # the learners' normal ends are listed as such (each shard saw them leave), nothing lost
    ends = {(x["kind"], x["learner"]) for x in status["marks"] if x["kind"] != "joined"}
    assert ends == {("finished", "L0"), ("finished", "L1")}, status["marks"]

    g = status["goodput"]
    assert 0 < g <= 1
    for other in (m["atoll_syncer_goodput_ratio"], summary["goodput"], final["goodput"],
                  sink["run/goodput"], goodput_series(events, report.learners)[1][-1]):  # fmt: skip
        assert other == pytest.approx(g, abs=1e-3)
    for text in (view["goodput"], report.header["goodput"].rstrip("%")):
        assert float(text) == pytest.approx(100 * g, abs=0.1)
    # over: the figure holds (it does not decay with the clock)
    assert state.goodput(time.time() + 3600) == sink["run/goodput"]

    # the held-out loss: /metrics has the last evaluation, taken once the budget was spent
    evals = [e.data for e in events if e.kind == "evaluated"]
    assert evals and evals[-1].tokens >= job.sim.budget_tokens(), evals
    assert m["atoll_syncer_eval_loss"] == evals[-1].eval_loss
