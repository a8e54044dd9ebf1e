"""Learner overhead of this tree against an earlier revision, side by side.

Runs `benchmarks/learner_overhead.py --repeats 1` alternately from a git worktree of `--rev`
(its own code, via PYTHONPATH) and from this tree, `--pairs` times (order alternating each
pair, so neither side always runs first on a warmer machine), and reports the median overhead
of each side and the per-pair differences. The same benchmark script is used for both sides:
each side's own copy (they may differ only in imports).

    .venv/bin/python benchmarks/overhead_vs_rev.py --rev HEAD~1 [--pairs 4] [--comm process]
        [--out benchmarks/results/overhead_vs_rev.json]

Writes the JSON and a PNG next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_side(tree: Path, out: Path, comm: str, schedule: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [sys.executable, str(tree / "benchmarks" / "learner_overhead.py"), "--repeats", "1",
           "--comm", comm, "--schedule", schedule, "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, cwd=tree)
    return json.loads(out.read_text())


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    for side, color in (("rev", "tab:gray"), ("tree", "tab:blue")):
        vals = [100 * x for x in result[side]["overheads"]]
        label = f"{result[side]['name']}: median {100 * result[side]['median']:+.2f}%"
        ax.plot(range(1, len(vals) + 1), vals, "o-", color=color, label=label)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sidebyside import finish_plot

    title = f"learner overhead, {result['revision']} vs this tree, comm={result['comm']}"
    finish_plot(fig, ax, path, "pair", "learner overhead (%)", title)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default="HEAD~1")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--comm", choices=("process", "thread"), default="process")
    ap.add_argument("--schedule", choices=("push", "pull"), default="push")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/overhead_vs_rev.json")
    args = ap.parse_args()
    sha = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="atoll-ab-"))
    old = tmp / "rev"
    subprocess.run(["git", "worktree", "add", "--detach", str(old), sha], cwd=ROOT, check=True,
                   capture_output=True)  # fmt: skip
    sides = {"rev": (old, []), "tree": (ROOT, [])}
    try:
        for i in range(args.pairs):
            order = ["rev", "tree"] if i % 2 == 0 else ["tree", "rev"]
            for side in order:
                tree, got = sides[side]
                r = run_side(tree, tmp / f"{side}-{i}.json", args.comm, args.schedule)
                got.append(r["overhead_median"])
                print(f"pair {i + 1}/{args.pairs} {side}: {100 * got[-1]:+.2f}%", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT,
                       capture_output=True)  # fmt: skip
    result = {
        "what": "learner_overhead.py --repeats 1, alternating an earlier revision and this tree",
        "command": f"benchmarks/overhead_vs_rev.py --rev {args.rev} --pairs {args.pairs} "
        f"--comm {args.comm} --schedule {args.schedule}",
        "revision": sha,
        "comm": args.comm,
        "schedule": args.schedule,
    }
    for side, (_, got) in sides.items():
        result[side] = {"name": sha if side == "rev" else "this tree", "overheads": got,
                        "median": statistics.median(got)}  # fmt: skip
    diffs = [b - a for a, b in zip(sides["rev"][1], sides["tree"][1], strict=True)]
    result["tree_minus_rev_per_pair"] = diffs
    result["tree_minus_rev_median"] = statistics.median(diffs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    plot(result, args.out.with_suffix(".png"))
    print(f"{sha}: {100 * result['rev']['median']:+.2f}%  this tree: "
          f"{100 * result['tree']['median']:+.2f}%  (tree - rev per pair, median: "
          f"{100 * result['tree_minus_rev_median']:+.2f} points)  -> {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
