"""Print the markdown tables of BENCHMARKS.md from the JSON in benchmarks/results/.

.venv/bin/python benchmarks/tables.py
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def sim_table(preset: str) -> str:
    data = json.loads((RESULTS / f"sim_{preset}.json").read_text())
    lines = [
        "| run | loss | goodput | sim time | MB up / down (heal) | DP bytes ÷ up | ÷ both ways "
        "| learners per merge | blocked s | failures | down s | lost work s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["runs"]:
        both = r["bytes_up"] + r["bytes_down"]
        lines.append(
            f"| {r['name']} | {r['eval_loss']:.4f} | {100 * r['goodput']:.1f}% "
            f"| {r['wall_time_s']:.0f} s "
            f"| {r['bytes_up'] / 1e6:.1f} / {r['bytes_down'] / 1e6:.1f} "
            f"({r.get('bytes_heal', 0) / 1e6:.1f}) "
            f"| {r['dp_bytes'] / max(r['bytes_up'], 1):.3g}× | {r['dp_bytes'] / max(both, 1):.3g}× "
            f"| {r['participants_mean']:.2f} | {r['blocked_s']:.0f} | {r['failures']} "
            f"| {r['down_s']:.0f} | {r['lost_work_s']:.0f} |"
        )
    return "\n".join(lines)


def outer_table() -> str:
    data = json.loads((RESULTS / "outer_sweep.json").read_text())
    lines = ["| variant | median loss | per seed |", "|---|---|---|"]
    for r in data["rows"]:
        seeds = ", ".join(f"{x:.4f}" for x in r["losses"])
        lines.append(f"| {r['variant']} | {r['median_loss']:.4f} | {seeds} |")
    return "\n".join(lines)


if __name__ == "__main__":
    for preset in ("compare", "hetero", "failures", "quick"):
        if (RESULTS / f"sim_{preset}.json").exists():
            print(f"## {preset}\n\n{sim_table(preset)}\n")
    print(f"## outer sweep\n\n{outer_table()}")
