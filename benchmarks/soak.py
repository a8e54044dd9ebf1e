"""Soak: a long live run under chaos beside a fault-free run of the same length, and the
virtual-time driver's prediction for the same scenario.

    .venv/bin/python benchmarks/soak.py --minutes 20          # the issue's figure
    .venv/bin/python benchmarks/soak.py --minutes 1 --quick   # a smoke run

The scenario (written to the run directory as soak.toml, the language of atoll.chaos): a
learner killed every minute on average (seeded Poisson, back after 3 s), a stall every three
minutes, one cut link of 10 s, a slowed link, and two syncer kills. Both live runs use the
demo's settings (4 learners, L3 40% slower, quorum 1 with grace) with a token budget sized to
last `--minutes` without faults. Reported (benchmarks/results/soak.json, soak.png): kills
survived, time to train again after a restart (median, worst), committed rounds lost,
goodput, eval loss against the fault-free run, and the simulated goodput of the scenario.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SETTINGS = ["learners=4", "speeds=1,1,1,1.4", "quorum=1", "grace=true", "schedule=pull"]
STEPS_PER_MIN = 460  # steps per learner per minute of the demo model on this 2-core machine


def scenario(minutes: float) -> str:
    horizon = 60.0 * minutes
    cut_at, syncer_at = 0.35 * horizon, (0.3 * horizon, 0.7 * horizon)
    return f"""# soak: {minutes:g} minutes (benchmarks/soak.py)
horizon_s = {horizon}

[[random]]
kind = "kill"
rate_per_min = 1.0
duration = 3.0
start = 5.0
end = {horizon - 20.0}

[[random]]
kind = "stall"
rate_per_min = 0.33
duration = 3.0
start = 5.0
end = {horizon - 20.0}

[[fault]]
kind = "cut"
target = "L0"
at = {cut_at}
duration = 10.0

[[fault]]
kind = "slow"
target = "L2"
at = {0.5 * horizon}
duration = 20.0
factor = 4.0

[[fault]]
kind = "kill_syncer"
target = "syncer"
at = {syncer_at[0]}
duration = 3.0

[[fault]]
kind = "kill_syncer"
target = "syncer"
at = {syncer_at[1]}
duration = 3.0
"""


def live(out: Path, steps: int, chaos: str, minutes: float) -> dict:
    sets = [*SETTINGS, f"steps={steps}", f"max_wall_s={120 * minutes + 300}"]
    if chaos:
        sets.append(f"chaos={chaos}")
    cmd = [sys.executable, "-m", "atoll.cli", "run", "--out", str(out)]
    for kv in sets:
        cmd += ["--set", kv]
    t0 = time.time()
    print(f"[soak] {'chaos' if chaos else 'fault-free'} run: {out}", flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    s = json.loads((out / "summary.json").read_text())
    s["wall_s"] = time.time() - t0
    return s


# the prediction's model: goodput depends on step times, faults and links, not on the model's
# values, so a tiny one keeps the virtual-time run short
SIM_MODEL = ["n_layer=2", "d_model=16", "n_head=2", "eval_points=2"]


def base_step_time(clean: dict) -> float:
    """The live fault-free run's step time of a speed-1 learner: learner i makes
    window / (base * speed_i) steps."""
    speeds = [1.0, 1.0, 1.0, 1.4]
    c = clean["settings"]
    steps_total = clean["tokens"] / (c.get("batch", 16) * c.get("context", 64))
    return clean["training_window_s"] * sum(1 / x for x in speeds) / max(steps_total, 1.0)


def simulated(scen: Path, steps: int, step_time_s: float) -> dict:
    """The virtual-time driver's goodput for the same scenario and step time."""
    out = RESULTS / "soak-sim"
    cmd = [sys.executable, "-m", "atoll.cli", "sim", "--preset", "quick", "--out", str(out),
           "--json", str(out / "r.json"), "--no-plot", "--quiet"]  # fmt: skip
    sets = [*SETTINGS, *SIM_MODEL, f"steps={steps}", f"step_time_s={step_time_s}"]
    for kv in [*sets, f"scenario={scen}"]:
        cmd += ["--set", kv]
    subprocess.run(cmd, check=True, cwd=ROOT)
    res = json.loads((out / "r.json").read_text())
    runs = [r for r in res["runs"] if r.get("method", "").startswith("decoupled")]
    return {"goodput": runs[0].get("goodput"), "eval_loss": runs[0].get("final_eval")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/atoll-soak"))
    ap.add_argument("--no-sim", action="store_true")
    ap.add_argument("--steps", type=int, default=0, help="steps per learner (default: minutes)")
    ap.add_argument("--clean", type=Path, help="a fault-free run of the same steps to reuse")
    args = ap.parse_args()
    steps = args.steps or int(STEPS_PER_MIN * args.minutes)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%H%M%S")
    scen = args.out / f"soak-{stamp}.toml"
    scen.write_text(scenario(args.minutes))
    chaos = live(args.out / f"chaos-{stamp}", steps, str(scen), args.minutes)
    if args.clean:  # measured before, side by side on this machine
        clean = json.loads((args.clean / "summary.json").read_text())
        clean.setdefault("wall_s", clean["wall_time_s"])
    else:
        clean = live(args.out / f"clean-{stamp}", steps, "", args.minutes)
    rejoin = chaos["rejoin_times_s"]
    ev = [json.loads(x) for x in (args.out / f"chaos-{stamp}" / "events.jsonl").open()]
    acts = [e["data"]["action"] for e in ev if e["kind"] == "chaos"]
    kills = acts.count("kill")
    result = {
        "minutes": args.minutes,
        "steps_per_learner": steps,
        "scenario": scenario(args.minutes),
        "learner_kills": kills,
        "kills_back": len(rejoin),
        "faults": {a: acts.count(a) for a in sorted(set(acts))},
        "syncer_kills": chaos["syncer_kills"],
        "syncer_restarts": chaos["syncer_restarts"],
        "rejoin_median_s": statistics.median(rejoin) if rejoin else None,
        "rejoin_worst_s": max(rejoin) if rejoin else None,
        "lost_committed_rounds": chaos["lost_committed_rounds"],
        "goodput": chaos["goodput"],
        "goodput_fault_free": clean["goodput"],
        "eval_loss": chaos["eval_loss"],
        "eval_loss_fault_free": clean["eval_loss"],
        "eval_ratio": chaos["eval_loss"] / clean["eval_loss"],
        "wall_s": chaos["wall_s"],
        "wall_s_fault_free": clean["wall_s"],
        "rounds": chaos["rounds"],
        "refused": chaos["refused"],
    }
    if not args.no_sim:
        try:
            step_time = base_step_time(clean)
            result["simulated"] = {"step_time_s": step_time, **simulated(scen, steps, step_time)}
        except (subprocess.CalledProcessError, KeyError, IndexError, OSError) as exc:
            result["simulated"] = {"error": str(exc)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(result, indent=1))
    _plot(result, rejoin)
    print(json.dumps({k: v for k, v in result.items() if k != "scenario"}, indent=1))
    return 0


def _plot(r: dict, rejoin: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.bar(["chaos", "fault-free"], [r["goodput"], r["goodput_fault_free"]], color=["C3", "C0"])
    a.set_ylim(0, 1)
    a.set_title(f"goodput ({r['minutes']:g} min, {r['learner_kills']} learner kills)")
    b.hist(rejoin or [0], bins=12, color="C2")
    b.set_title("time to train again after a learner restart (s)")
    fig.tight_layout()
    fig.savefig(RESULTS / "soak.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
