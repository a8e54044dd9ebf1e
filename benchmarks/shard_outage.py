"""One shard of two killed and restored while the other keeps closing rounds: a timeline.

Starts `atoll syncer --shards 2` (each shard in RUN_DIR/shard-i with its own tape and
snapshots) and --learners built-in learners (`atoll learner`, the shard addresses in order).
Once both shards have merged for --kill-after-s seconds, shard 1 is SIGKILLed; the shard set
restarts it on its port and it restores from its own tape. The learners run to the token
budget. From the run's events.jsonl:
  rounds per shard over time (round_closed, fragment -> shard by atoll.core.shards.assign),
  the outage: from the kill to shard 1's `restored` event, and to its first round after,
  shard 0's round rate before and during the outage,
  committed rounds lost: the syncer's books (restore) and every resuming learner's seen_check,
  whether the learners finished.

    .venv/bin/python benchmarks/shard_outage.py [--learners 2 --steps 1000 --kill-after-s 8]

Writes benchmarks/results/shard_outage.json and shard_outage.png (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

from atoll.config import load_job  # noqa: E402
from atoll.core.shards import assign  # noqa: E402
from atoll.eventlog import read_events  # noqa: E402
from atoll.live.client import syncer_address  # noqa: E402
from atoll.model.recipe import builtin_plan  # noqa: E402

RUN = "shard-outage"


def shard_pid(index: int, count: int) -> int:
    """The pid of the process that runs shard `index` of `count` of this run."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{index}/{count}".encode() in argv and RUN.encode() in argv:
            return int(d.name)
    raise RuntimeError(f"no process runs shard {index}/{count}")


def rounds(events: list[dict], shard_of: list[int]) -> list[tuple[float, int]]:
    return [
        (e["t"], shard_of[e["data"]["fragment"]]) for e in events if e["kind"] == "round_closed"
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--learners", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1000, help="the token budget, in steps")
    ap.add_argument("--kill-after-s", type=float, default=8.0)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "shard_outage.json")
    args = ap.parse_args()
    sets = ["--set", f"learners={args.learners}", "--set", f"steps={args.steps}"]
    sets += ["--set", "snapshot_every_s=5"]
    job = load_job([s for s in sets if s != "--set"], None)
    plan, _ = builtin_plan(job.sim)
    shard_of = assign([f.numel for f in plan.fragments], 2)
    run_dir = Path(tempfile.mkdtemp(prefix="atoll-outage-"))
    env = {**os.environ, "ATOLL_SECRET": secrets.token_hex(16), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = str(ROOT / "src")
    py = [sys.executable, "-m", "atoll.cli"]
    log = open(run_dir / "syncer.log", "wb")  # noqa: SIM115 - the process writes it
    argv = [*py, "syncer", "--run-dir", str(run_dir), "--shards", "2", "--run-id", RUN, *sets]
    syncer = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    addr = syncer_address(run_dir, 120, alive=lambda: syncer.poll() is None)
    assert addr, (run_dir / "syncer.log").read_text()
    print(f"shards on {addr}; {args.learners} learners; run dir {run_dir}", flush=True)
    learners = []
    for i in range(args.learners):
        lg = open(run_dir / f"L{i}.log", "wb")  # noqa: SIM115
        argv = [*py, "learner", *sets, "--syncer", addr, "--index", str(i), "--run-id", RUN]
        argv += ["--events", str(run_dir / "events.jsonl")]
        learners.append(subprocess.Popen(argv, env=env, stdout=lg, stderr=lg))
    start = time.time()
    both = None
    while True:
        seen = {s for _, s in rounds(read_events(run_dir / "events.jsonl"), shard_of)}
        if both is None and seen == {0, 1}:
            both = time.time()
            print(f"both shards merging after {both - start:.1f} s", flush=True)
        if both is not None and time.time() - both >= args.kill_after_s:
            break
        time.sleep(0.2)
    killed_at = time.time()
    os.kill(shard_pid(1, 2), signal.SIGKILL)
    print(f"killed shard 1 at {killed_at - start:.1f} s", flush=True)
    finished = [p.wait(600) == 0 for p in learners]
    syncer.send_signal(signal.SIGTERM)
    syncer.wait(120)
    events = read_events(run_dir / "events.jsonl")
    rs = rounds(events, shard_of)
    restored_at = min(e["t"] for e in events if e["kind"] == "restored" and e["t"] > killed_at)
    back_at = min(t for t, s in rs if s == 1 and t > killed_at)
    before = [t for t, s in rs if s == 0 and both <= t < killed_at]
    during = [t for t, s in rs if s == 0 and killed_at <= t < back_at]
    books = json.loads((run_dir / "syncer_final.json").read_text())
    seen = [e["data"]["lost_committed_rounds"] for e in events if e["kind"] == "seen_check"]
    out = {
        "learners": args.learners,
        "steps": args.steps,
        "fragments_per_shard": [shard_of.count(0), shard_of.count(1)],
        "values_per_shard": [
            sum(f.numel for f, s in zip(plan.fragments, shard_of, strict=True) if s == i)
            for i in range(2)
        ],  # fmt: skip
        "killed_at_s": killed_at - start,
        "restored_after_s": restored_at - killed_at,
        "shard1_first_round_after_s": back_at - killed_at,
        "shard0_rounds_per_s_before": len(before) / max(killed_at - both, 1e-9),
        "shard0_rounds_per_s_during_outage": len(during) / max(back_at - killed_at, 1e-9),
        "shard0_rounds_during_outage": len(during),
        "shard1_rounds_during_outage": sum(1 for t, s in rs if s == 1 and killed_at < t < back_at),
        "rounds_per_shard": [sum(1 for _, s in rs if s == i) for i in range(2)],
        "lost_committed_rounds_books": books.get("lost_committed_rounds"),
        "shard_restarts": [sh.get("restarts") for sh in books.get("shards", [])],
        "seen_checks": len(seen),
        "lost_committed_rounds_seen_by_learners": sum(seen),
        "learners_finished": finished,
        "timeline": [(round(t - start, 3), s) for t, s in rs],
        "run_dir": str(run_dir),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    plot(out, args.out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in out.items() if k != "timeline"}, indent=1))
    return 0


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for s, color in ((0, "tab:blue"), (1, "tab:orange")):
        ts = [t for t, sh in out["timeline"] if sh == s]
        ax.step(ts, range(1, len(ts) + 1), where="post", color=color, label=f"shard {s}")
    k = out["killed_at_s"]
    ax.axvspan(k, k + out["shard1_first_round_after_s"], color="tab:red", alpha=0.15,
               label="shard 1 down (kill to its first round after restore)")  # fmt: skip
    ax.axvline(k + out["restored_after_s"], color="tab:red", ls=":", label="shard 1 restored")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("rounds closed (cumulative)")
    lost = out["lost_committed_rounds_books"]
    ax.set_title(f"2 shards, shard 1 killed: shard 0 closed {out['shard0_rounds_during_outage']}"
                 f" rounds meanwhile; committed rounds lost: {lost}")  # fmt: skip
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
