"""Check the bandwidth model (atoll.bandwidth) against bytes measured in a live run.

Runs `atoll run` (4 learners of equal speed on loopback, pull schedule, int4, no chaos), then
compares the learners' measured upload bytes with the model's Decoupled rate for the same
model size, P, H and tau over the same time. The model's `bits` is the codec's real cost per
value: int4 plus one bf16 scale per group of 64 values = 4.25 bits. The step time is the
learners' own median reported step time (the syncer pulls one fragment per measured step).

    .venv/bin/python benchmarks/bandwidth_live_check.py [--steps 200]

Writes benchmarks/results/bandwidth_live_check.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from atoll.bandwidth.model import BandwidthConfig, average_rate, measured_vs_predicted
from atoll.config import SimConfig
from atoll.core.fragments import make_plan
from atoll.model import GPT
from atoll.model.recipe import gpt_config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/bandwidth_live_check.json")
    )
    args = ap.parse_args()
    cfg = SimConfig()
    run_dir = Path(tempfile.mkdtemp(prefix="atoll-bw-")) / "run"
    cmd = [
        sys.executable,
        "-m",
        "atoll.cli",
        "run",
        "--out",
        str(run_dir),
        "--quiet",
        "--set",
        "learners=4",
        "--set",
        f"steps={args.steps}",
        "--set",
        "pace_s=0",
        "--set",
        "codec=int4",
        "--set",
        "schedule=pull",
    ]
    subprocess.run(cmd, check=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    model = GPT(gpt_config(cfg))
    params = sum(p.numel() for p in model.parameters())
    plan = make_plan(
        {n: tuple(p.shape) for n, p in model.named_parameters()},
        cfg.P,
        cfg.H,
        model.embedding_names(),
    )
    step_times, merged_bytes, merged_values = [], 0, 0
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["kind"] == "step" and e["data"].get("step_time"):
            step_times.append(e["data"]["step_time"])
        if e["kind"] == "round_closed":
            merged_bytes += e["data"]["bytes_in"]
            merged_values += (
                len(e["data"]["participants"]) * plan.fragments[e["data"]["fragment"]].numel
            )
    step_s = statistics.median(step_times)
    bw = BandwidthConfig(
        params=params, step_s=step_s, bits=4.25, fragments=cfg.P, H=cfg.H, tau=cfg.tau
    )
    per_link = summary["bytes_up"] / 4
    duration = summary["training_window_s"]
    ratio = measured_vs_predicted("decoupled", bw, per_link, duration)
    # the same check with the realised step period (training window / steps) as step time
    realised = BandwidthConfig(
        params=params,
        step_s=duration / args.steps,
        bits=4.25,
        fragments=cfg.P,
        H=cfg.H,
        tau=cfg.tau,
    )
    ratio_realised = measured_vs_predicted("decoupled", realised, per_link, duration)
    out = {
        "command": " ".join(cmd[2:]),
        "params": params,
        "step_s_median": step_s,
        "duration_s": duration,
        "measured_bytes_up_per_learner": per_link,
        "predicted_bytes_up_per_learner": average_rate("decoupled", bw) * duration / 8,
        "measured_over_predicted": ratio,
        "step_s_realised": duration / args.steps,
        "measured_over_predicted_realised_step": ratio_realised,
        "bits_per_value_measured": 8 * merged_bytes / max(merged_values, 1),
        "bits_per_value_model": 4.25,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
