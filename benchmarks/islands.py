"""Islands against single-process learners at equal tokens (`atoll run`, the built-in model).

    .venv/bin/python benchmarks/islands.py [--steps 300] [--repeats 2]

Two runs side by side, alternating, `--repeats` times each:
- `single`:  2 learners of one process each (`island_size=1`);
- `islands`: 2 learners that are islands of 2 DDP ranks each (`island_size=2`, torchrun, gloo).
Both spend the same token budget (learners x steps x batch x context) with the same recipe:
`batch` is the learner's, and an island's 2 ranks train half of it each (DDP averages their
gradients), so an island is the same learner on more processes. Both are paced (`--pace`
seconds per step) so that the rounds meet alike. The figure is the final eval loss (the
syncer's global model on the held-out split): islands within 3% of single.

Writes benchmarks/results/islands/islands.json and islands.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"single": "1", "islands": "2"}


def run(kind: str, steps: int, pace: float, out: Path) -> dict:
    sets = ["learners=2", f"steps={steps}", f"island_size={CONFIGS[kind]}", f"pace_s={pace}"]
    cmd = [sys.executable, "-m", "atoll.cli", "run", "--out", str(out), "--quiet"]
    cmd += [x for s in sets for x in ("--set", s)]
    t0 = time.time()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"{kind}: atoll run failed:\n{res.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    keys = ("eval_loss", "tokens", "token_budget", "rounds", "lost_committed_rounds", "goodput")
    return {"kind": kind, "wall_s": round(time.time() - t0, 1), **{k: s[k] for k in keys}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="steps per single-process learner")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pace", type=float, default=0.1, help="seconds per step (pace_s)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/islands")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for kind in CONFIGS:  # alternating: single, islands, single, islands, ...
                row = run(kind, args.steps, args.pace, Path(tmp) / f"{kind}-{r}")
                rows.append(row)
                print(f"[{len(rows)}/{2 * args.repeats}] {kind:8s} eval loss "
                      f"{row['eval_loss']:.4f}  wall {row['wall_s']} s", flush=True)  # fmt: skip
    med = {k: statistics.median(r["eval_loss"] for r in rows if r["kind"] == k) for k in CONFIGS}
    ratio = med["islands"] / med["single"]
    result = {
        "steps": args.steps,
        "pace_s": args.pace,
        "repeats": args.repeats,
        "runs": rows,
        "median_eval_loss": med,
        "islands_over_single": round(ratio, 4),
        "within_3pct": abs(ratio - 1) <= 0.03,
    }
    (args.out / "islands.json").write_text(json.dumps(result, indent=1))
    print(f"median eval loss: single {med['single']:.4f}, islands {med['islands']:.4f} "
          f"(x{ratio:.4f})")  # fmt: skip
    plot(rows, args.out / "islands.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for i, kind in enumerate(CONFIGS):
        vals = [r["eval_loss"] for r in rows if r["kind"] == kind]
        ax.bar(i, statistics.median(vals), color="C0" if i == 0 else "C1", alpha=0.6)
        ax.scatter([i] * len(vals), vals, color="k", zorder=3, s=12)
    ax.set_xticks(range(len(CONFIGS)), ["2 learners x 1 process", "2 islands x 2 DDP ranks"])
    lo = min(r["eval_loss"] for r in rows)
    ax.set_ylim(lo * 0.9, max(r["eval_loss"] for r in rows) * 1.03)
    ax.set_ylabel("final eval loss (nats/byte)")
    ax.set_title("equal tokens: bars median, dots runs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
