"""Goodput simulator benchmark: speed at scale and the paper's table.

Writes benchmarks/results/goodput_scale.json, goodput_table.json and goodput_timeline.png.
Timings are medians over repeats (wall clock, this machine).

    .venv/bin/python benchmarks/goodput_scale.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

from atoll.goodput import Cluster, Constants, parse_system, simulate
from atoll.goodput.calibrate import fit, table
from atoll.goodput.cli import format_table
from atoll.goodput.plot import plot_timeline
from atoll.goodput.systems import TABLE_SYSTEMS

OUT = Path(__file__).parent / "results"
DAY = 86400.0


def timed(fn, repeats: int) -> tuple[float, list[float], object]:
    times, value = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    constants = fit()
    big = Cluster(2_400_000)
    single = {}
    for name in TABLE_SYSTEMS:
        med, times, r = timed(
            lambda n=name: simulate(parse_system(n), big, constants, 30 * DAY, seed=0), args.repeats
        )
        single[name] = {
            "median_s": med,
            "runs_s": times,
            "goodput": r.goodput,
            "interruptions": r.interruptions,
        }
        print(f"2.4M chips, 30 days, {name:<14} median {med:.3f} s  goodput {r.goodput:.3f}")
    med, times, doc = timed(lambda: table(seed=0), args.repeats)
    print(format_table(doc))
    print(f"whole table (fit + 30 simulations of 30 days): median {med:.2f} s")
    results = [
        simulate(parse_system(n), Cluster(1_200_000), constants, 30 * DAY, seed=0)
        for n in TABLE_SYSTEMS
    ]
    plot_timeline(
        results,
        OUT / "goodput_timeline.png",
        "1.2M chips, chip MTBI 1 year, 30 simulated days (constants fitted on dp rows)",
    )
    (OUT / "goodput_table.json").write_text(json.dumps(doc, indent=1))
    # Sensitivity: the same fit with the chip speed spread fixed at 0 instead of fitted.
    doc0 = table(replace(Constants(), speed_sigma=0.0), frozenset({"speed_sigma"}), seed=0)
    print(format_table(doc0))
    (OUT / "goodput_table_sigma0.json").write_text(json.dumps(doc0, indent=1))
    (OUT / "goodput_scale.json").write_text(
        json.dumps(
            {
                "machine": {
                    "python": platform.python_version(),
                    "processor": platform.processor(),
                    "machine": platform.machine(),
                },
                "repeats": args.repeats,
                "single_run_2_4M_chips_30_days": single,
                "whole_table": {"median_s": med, "runs_s": times},
                "limits_s": {"single_run": 5.0, "whole_table": 60.0},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
