"""Chaos through `atoll run` (real processes, gRPC on loopback, tiny models): a scenario of
atoll.chaos with every kind of fault, and a syncer that is down when the learners finish."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from atoll.eventlog import read_events
from tests.helpers import started_address

pytestmark = pytest.mark.slow

TINY = [
    "n_layer=1", "d_model=16", "n_head=2", "context=16", "batch=4", "P=4", "H=4",
    "data_bytes=200000", "eval_batches=2", "lost_after_s=2.0", "snapshot_every_s=2",
    "restart_delay_s=0.5",
]  # fmt: skip


def _run(out, extra, timeout=240):
    sets = []
    for kv in [*TINY, *extra]:
        sets += ["--set", kv]
    cmd = [sys.executable, "-m", "atoll.cli", "run", "--out", str(out), "--quiet", *sets]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    events = read_events(out / "events.jsonl")
    quiet = ("accepted", "round_closed", "applied", "step")
    story = [(round(e["t"] - events[0]["t"], 2), e["kind"], e["source"], e["data"])
             for e in events if e["kind"] not in quiet]  # fmt: skip
    return json.loads((out / "summary.json").read_text()), events, story


# issue 9, defects 9 and 12
def test_a_syncer_down_when_the_learners_finish_is_brought_back(tmp_path):
    """The syncer is killed 2 s into training and stays down 8 s; the learners reach their
    share meanwhile. Before: they exited with their work unmerged and the launcher exited 0
    without restarting the syncer (tokens 0, eval NaN, no final model). Now they wait for
    it, it is restarted from its tape, their work is merged and the result written."""
    out = tmp_path / "run"
    s, events, story = _run(
        out, ["learners=2", "steps=120", "pace_s=0.02", "chaos=kill:syncer@2+8"]
    )
    assert (out / "final.safetensors").exists(), story
    assert s["syncer_restarts"] == 1 and s["lost_committed_rounds"] == 0, story
    # before: tokens 0 and eval NaN (no final model); then, a final beat sent while the
    # control channel was still reconnecting failed fast, and the books kept the snapshot's
    # count (9,856 of 15,360): every learner's final counters are now counted
    assert s["tokens"] >= s["token_budget"] and math.isfinite(s["eval_loss"]), s
    assert not [e for e in events if e["kind"] == "final_beat_lost"], story
    back = next(e["t"] for e in events if e["kind"] == "restored")
    for lid in ("L0", "L1"):  # what each trained while the syncer was away got merged
        assert any(
            e["kind"] == "accepted" and e["data"]["learner"] == lid and e["t"] > back
            for e in events
        ), story


SCENARIO = """
[[fault]]
kind = "add"
target = "L4"
at = 3.0

[[fault]]
kind = "kill"
target = "L1"
at = 5.0
duration = 2.0

[[fault]]
kind = "stall"
target = "L2"
at = 9.0
duration = 3.0

[[fault]]
kind = "cut"
target = "L0"
at = 13.0
duration = 4.0

[[fault]]
kind = "slow"
target = "L3"
at = 14.0
duration = 4.0
factor = 4.0

[[fault]]
kind = "kill_syncer"
target = "syncer"
at = 19.0
duration = 2.0

[[fault]]
kind = "remove"
target = "L3"
at = 24.0
"""


def test_a_scenario_of_every_fault_kind_runs_live_and_nothing_is_lost(tmp_path):
    """The 1-minute version of the soak (benchmarks/soak.py): one fault of each kind."""
    scenario = tmp_path / "chaos.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "run"
    s, events, story = _run(
        out,
        # 600 steps at 0.05 s: L4, added at 3 s, still trains 10 s after the syncer is back
        # at 21 s (with 450 it ended 4.5 s after, and a slow restart on a busy machine left it
        # nothing to send after: one CI run of three failed so)
        ["learners=5", "steps=600", "pace_s=0.05", f"chaos={scenario}", "eval=false"],
        timeout=300,
    )
    chaos = [(e["data"]["action"], e["data"]["process"]) for e in events if e["kind"] == "chaos"]
    assert len(chaos) == 7, story
    assert s["lost_committed_rounds"] == 0 and s["syncer_restarts"] == 1, story
    assert len(s["rejoin_times_s"]) == 1, story  # the killed L1 trained again

    def accepted_after(lid, t):
        return any(
            e["kind"] == "accepted" and e["data"]["learner"] == lid and e["t"] > t for e in events
        )

    t0 = next(e["t"] for e in events if e["kind"] == "chaos")  # 3 s into training
    at = {a: t0 - 3.0 + x for a, x in (("stall", 12.0), ("cut", 17.0), ("syncer", 21.0))}
    assert accepted_after("L4", t0), story  # added late, trained and merged
    # ... at the run's pace from its own start: before, it paced on the run's grid, 10 s
    # behind at its join, ran unpaced to catch up and finished while the syncer was down
    l4 = [(e["t"], e["data"]["step"]) for e in events if (e["kind"], e["source"]) == ("step", "L4")]
    assert len(l4) >= 2 and l4[-1][0] - l4[0][0] >= 0.9 * 0.05 * (l4[-1][1] - l4[0][1]), l4
    assert accepted_after("L2", at["stall"]) and accepted_after("L0", at["cut"]), story
    for lid in ("L0", "L1", "L2", "L4"):  # everyone left after the syncer came back
        assert accepted_after(lid, at["syncer"]), (lid, story)
    removed = next(
        e["t"] for e in events if e["kind"] == "chaos" and e["data"]["action"] == "remove"
    )
    assert not accepted_after("L3", removed + 2.0), story
    assert (out / "final.safetensors").exists()


def _syncer(run_dir, fsize=None, port=0):
    import os

    # a disk that fills up: writes past `fsize` bytes fail (EFBIG), set by a small program that
    # then execs the syncer (not a preexec_fn: forking this process, which has used gRPC, with
    # Python code to run before exec loses a few children in a hundred)
    limit = (
        "import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize})); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    sets = []
    for kv in [*TINY, "learners=1", "steps=100000", "snapshot_every_s=600", f"port={port}"]:
        sets += ["--set", kv]
    (run_dir / "syncer.addr").unlink(missing_ok=True)
    wrap = [sys.executable, "-c", limit] if fsize else [sys.executable]
    proc = subprocess.Popen(
        [*wrap, "-m", "atoll.cli", "syncer", "--run-dir", str(run_dir),
         "--run-id", "disk", *sets],  # fmt: skip
        env={**os.environ, "ATOLL_SECRET": "disk-secret-0123"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    return proc


def test_a_full_disk_stops_the_syncer_before_it_sends_an_unrecorded_round(tmp_path):
    """The tape's disk fills up mid-run: the syncer exits 75 with `disk_failed`, having sent
    no round it could not record; restarted on a disk with room, it restores, the learner
    resumes, and no committed round is lost (the learner saw nothing the tape lacks)."""
    import time

    import torch

    from atoll.config import SimConfig
    from atoll.live.client import wait_ready
    from atoll.live.learner import Learner, LearnerOptions
    from atoll.model.recipe import new_model

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = _syncer(run_dir, fsize=150_000)
    # bounds, not timings: the suite's other worker may be running processes on the same cores
    addr = started_address(proc, run_dir, 90)
    wait_ready(addr, "disk", "disk-secret-0123", 20)
    cfg = SimConfig(n_layer=1, d_model=16, n_head=2, context=16, batch=4, P=4, H=4)
    model = new_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opts = LearnerOptions(learner_id="L0", run_id="disk", secret="disk-secret-0123",
                          comm="thread", events=str(run_dir / "events.jsonl"))  # fmt: skip
    learner = Learner(model, opt, addr, opts)
    x = torch.randint(0, 256, (4, 16))

    def train(n):
        for _ in range(n):
            model(x, x).backward()
            opt.step()
            opt.zero_grad()
            learner.step(tokens=64)
            time.sleep(0.01)

    until = time.time() + 120
    while proc.poll() is None and time.time() < until:
        train(10)
    out = proc.stdout.read().decode()
    assert proc.returncode == 75, out[-2000:]
    assert "disk_failed" in out
    proc = _syncer(run_dir, port=int(addr.rsplit(":", 1)[1]))  # the disk has room again
    until = time.time() + 90
    while not (run_dir / "syncer.addr").exists() and time.time() < until:
        train(2)
    resumed_at = time.time()
    until = time.time() + 60
    seen = []
    while not seen and time.time() < until:
        train(10)
        seen = [
            e for e in read_events(run_dir / "events.jsonl")
            if e["kind"] == "seen_check" and e["t"] > resumed_at - 1
        ]  # fmt: skip
    learner.finish(timeout=5)
    proc.send_signal(__import__("signal").SIGTERM)
    proc.wait(30)
    final = json.loads((run_dir / "syncer_final.json").read_text())
    assert seen and seen[0]["data"]["lost_committed_rounds"] == 0, seen
    assert final["lost_committed_rounds"] == 0 and final["restarts"] == 1


def test_a_state_that_cannot_be_restored_ends_the_run_with_what_to_do(tmp_path):
    """Before: the syncer raised `StoreError` from its constructor, crashed with a traceback
    and was restarted in a loop, and `atoll run --resume` waited 60 s for it. Now it exits
    65 with `restore_failed`, and the run stops with one line naming the file, what is wrong
    and what to do, leaving the files as they were."""
    out = tmp_path / "run"
    (out / "tape").mkdir(parents=True)
    junk = bytes(range(256)) * 20
    (out / "snapshot.safetensors").write_bytes(junk)
    sets = []
    for kv in [*TINY, "learners=1", "steps=20"]:
        sets += ["--set", kv]
    cmd = [sys.executable, "-m", "atoll.cli", "run", "--out", str(out), "--resume", "--quiet"]
    res = subprocess.run([*cmd, *sets], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert "atoll run: error: the run in" in res.stderr and "snapshot.safetensors" in res.stderr
    assert "tape/ and snapshot.safetensors moved away" in res.stderr
    events = read_events(out / "events.jsonl")
    assert [e["data"]["rc"] for e in events if e["kind"] == "crashed"] == [65]
    assert [e["kind"] for e in events].count("restore_failed") == 1  # not restarted
    assert (out / "snapshot.safetensors").read_bytes() == junk
