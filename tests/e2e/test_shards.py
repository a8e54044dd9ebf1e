"""A sharded syncer, as processes: `atoll syncer --shards 2` and two built-in learners. One
shard is killed and restored from its own tape while the other keeps closing rounds; nothing
committed is lost, the learners finish, and the run's model holds every shard's fragments.
Bad input stops with one line and disturbs no running shard."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atoll.config import load_job
from atoll.core.shards import assign
from atoll.eventlog import read_events
from atoll.live.client import status
from atoll.model.recipe import builtin_plan
from tests.helpers import RUN, SECRET, learner_process, syncer_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "ATOLL_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
SETS = ["--set", "learners=2", "--set", "steps=120", "--set", "snapshot_every_s=2"]


def _stat(pid: int) -> bytes:
    """/proc/PID/stat of a process, or a zombie's when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return b"(gone) Z "


def _shard_pid(index: int, run_dir: Path) -> int:
    """The pid of the process running shard `index` of 2 of the set in `run_dir` (another
    test's set may run at the same time)."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            mine = any(a.startswith(str(run_dir).encode()) for a in argv)
            if b"syncer" in argv and f"{index}/2".encode() in argv and mine:
                return int(d.name)
    raise AssertionError(f"no process runs shard {index}")


def _learner(addr: str, index: int, run_dir: Path) -> subprocess.Popen:
    return learner_process(addr, index, run_dir, SETS, ENV, ROOT)


def _syncer_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "atoll.cli", "syncer", *args]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)


def end_set(proc: subprocess.Popen, learners: list[subprocess.Popen]) -> None:
    """The learners killed if still running, the set ended (SIGTERM: it writes its books)."""
    for p in learners:
        if p.poll() is None:
            p.kill()
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)


def _rounds(run_dir: Path, shard_of: list[int]) -> list[tuple[float, int]]:
    events = read_events(run_dir / "events.jsonl")
    return [
        (e["t"], shard_of[e["data"]["fragment"]]) for e in events if e["kind"] == "round_closed"
    ]


def test_a_shard_killed_and_restored_loses_nothing_while_the_other_closes_rounds(tmp_path):
    plan, _ = builtin_plan(load_job([s for s in SETS if s != "--set"], None).sim)
    shard_of = assign([f.numel for f in plan.fragments], 2)
    proc, addr = syncer_process(tmp_path, ["--shards", "2", *SETS], ENV, ROOT)
    assert len(addr.split(",")) == 2
    learners = [_learner(addr, i, tmp_path) for i in range(2)]
    try:
        until = time.time() + 120
        while {s for _, s in _rounds(tmp_path, shard_of)} != {0, 1}:  # both shards merging
            assert time.time() < until and all(p.poll() is None for p in learners)
            time.sleep(0.2)
        pid = _shard_pid(1, tmp_path)
        os.kill(pid, signal.SIGKILL)
        # its last round may close between a clock read before the kill and the kill itself:
        # the kill's time is when the process is gone (a zombie writes nothing more)
        while b") Z " not in _stat(pid):
            time.sleep(0.01)
        killed_at = time.time()
        for p in learners:
            assert p.wait(150) == 0, (tmp_path / "L0.log").read_text()[-3000:]
        events = read_events(tmp_path / "events.jsonl")
        restored = [e["t"] for e in events if e["kind"] == "restored" and e["t"] > killed_at]
        assert restored, "shard 1 was not restored from its tape"
        during = [s for t, s in _rounds(tmp_path, shard_of) if killed_at < t < restored[0]]
        assert 0 in during and 1 not in during  # shard 0 went on while shard 1 was down
        after = [s for t, s in _rounds(tmp_path, shard_of) if t > restored[0]]
        assert 1 in after  # and shard 1 merged again once back
        lost = [e["data"]["lost_committed_rounds"] for e in events if e["kind"] == "seen_check"]
        assert lost and sum(lost) == 0, lost  # learners saw nothing the restore lacks
        assert proc.wait(120) == 0  # the budget spent, the learners gone: the set ends itself
    finally:
        end_set(proc, learners)
    books = json.loads((tmp_path / "syncer_final.json").read_text())
    assert books["lost_committed_rounds"] == 0 and books["shards"][1]["restarts"] >= 1
    assert sum(books["tokens"].values()) >= 120 * 2 * 16 * 64  # the home shard's count
    # ended by itself: every shard's core said the run is over once both learners had left,
    # and the set wrote one summary (atoll run's keys) and the report
    events = read_events(tmp_path / "events.jsonl")
    over = [e["data"] for e in events if e["kind"] == "run_over"]
    assert len(over) >= 2 and all(o["reason"] == "flushed" for o in over), over
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tokens"] >= summary["token_budget"] and summary["rounds"] > 0
    assert (tmp_path / "report.html").stat().st_size > 0
    from safetensors.torch import load_file

    final = load_file(str(tmp_path / "final.safetensors"))
    assert set(final) == {n for f in plan.fragments for n in f.names}  # every shard's tensors
    # the set's supervisor evaluated the whole model while the run went, from both shards' parts
    evals = [e["data"] for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "evaluated"]
    # (shard 1 was down for the points it missed: those never complete; the set's last point
    # is the budget's, and the model then is trained: under ln 256 = 5.5 nats, the start)
    assert evals and evals[-1]["tokens"] >= 120 * 2 * 16 * 64 and evals[-1]["eval_loss"] < 4.5
    assert [e["tokens"] for e in evals] == sorted(e["tokens"] for e in evals), evals


@pytest.mark.parametrize("shards", ["0", "999"])
def test_a_shard_count_outside_1_to_P_stops_with_one_line(tmp_path, shards):
    res = _syncer_cli("--run-dir", str(tmp_path / "r"), "--shards", shards)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"shards={shards}" in lines[0] and "fragments" in lines[0], lines
    assert not (tmp_path / "r").exists()  # nothing written


def test_a_learner_with_the_shards_out_of_order_or_another_run_is_refused(tmp_path):
    proc, addr = syncer_process(tmp_path, ["--shards", "2", *SETS], ENV, ROOT)
    try:
        a0, a1 = addr.split(",")

        import atoll
        from atoll.model.recipe import new_model

        model = new_model(load_job([s for s in SETS if s != "--set"], None).sim)
        with pytest.raises(atoll.JoinError) as e:
            opts = atoll.LearnerOptions(run_id=RUN, secret=SECRET, comm="thread",
                                        connect_timeout_s=30)  # fmt: skip
            atoll.Learner(model, None, f"{a1},{a0}", opts)
        assert "this syncer is shard" in str(e.value) and "shard order" in str(e.value)
        with pytest.raises(atoll.AuthError) as e:
            opts = dataclasses.replace(opts, run_id="another-run")
            atoll.Learner(model, None, addr, opts)
        assert "run" in str(e.value)
        # a shard started on the other shard's directory stops before reading it
        res = _syncer_cli(
            "--run-dir", str(tmp_path / "shard-1"), "--shard", "0/2", "--run-id", RUN, *SETS
        )
        assert res.returncode == 2 and "holds shard 1/2" in res.stderr, res.stderr
        st = status(addr, RUN, SECRET)  # the running set is undisturbed: it answers
        assert st.epoch
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
