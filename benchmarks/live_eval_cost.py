"""What the syncer's held-out evaluations while the run goes cost it: `atoll run` side by side
with `eval=true` (the syncer evaluates the global model at eighths of the token budget,
atoll/live/syncer/evaluation.py) and `eval=false`, alternating (off, on / on, off), --repeats
times each, on the same settings (4 learners, no chaos, free-running). From each run's
events and summary: goodput, rounds per second of the training window, round latency p50/p99
(quorum wait + grace, from `round_closed`), and the evaluations' own seconds. Medians over the
repeats, and the ratios on / off.

    .venv/bin/python benchmarks/live_eval_cost.py [--repeats 3 --steps 300]

Writes benchmarks/results/live_eval_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

from atoll.eventlog import load_events  # noqa: E402


def one(run_dir: Path, steps: int, evaluate: bool) -> dict:
    sets = ["learners=4", f"steps={steps}", f"eval={'true' if evaluate else 'false'}"]
    cmd = [sys.executable, "-m", "atoll.cli", "run", "--out", str(run_dir)]
    cmd += [x for s in sets for x in ("--set", s)]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    s = json.loads((run_dir / "summary.json").read_text())
    events = load_events(run_dir / "events.jsonl")
    lat = sorted(
        max(e.data.quorum_wait_s, 0.0) + max(e.data.grace_s, 0.0)
        for e in events
        if e.kind == "round_closed"
    )
    evals = [e.data for e in events if e.kind == "evaluated"]
    return {
        "goodput": s["goodput"],
        "rounds_per_s": s["rounds"] / s["training_window_s"],
        "tokens_per_s": s["tokens"] / s["training_window_s"],
        "p50_ms": 1e3 * lat[len(lat) // 2],
        "p99_ms": 1e3 * lat[min(int(0.99 * len(lat)), len(lat) - 1)],
        "evaluations": len(evals),
        "eval_s_total": sum(e.eval_s for e in evals),
        "eval_loss": s["eval_loss"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "live_eval_cost.json")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for r in range(args.repeats):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        for mode in order:
            run_dir = Path(tempfile.mkdtemp(prefix=f"atoll-evalcost-{mode}-{r}-")) / "run"
            row = one(run_dir, args.steps, mode == "on")
            runs[mode].append(row)
            print(f"[{r + 1}/{args.repeats}] eval {mode}: {row}", flush=True)
    keys = ("goodput", "rounds_per_s", "tokens_per_s", "p50_ms", "p99_ms")
    med = {m: {k: statistics.median(x[k] for x in rs) for k in keys} for m, rs in runs.items()}
    ratio = {k: med["on"][k] / med["off"][k] for k in keys}
    evals = {
        "per_run": statistics.median(x["evaluations"] for x in runs["on"]),
        "seconds_per_run": statistics.median(x["eval_s_total"] for x in runs["on"]),
    }
    result = {"runs": runs, "median": med, "on_over_off": ratio, "evaluations": evals,
              "config": vars(args)}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({"median": med, "on_over_off": ratio, "evaluations": evals}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
