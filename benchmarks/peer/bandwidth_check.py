"""`atoll bandwidth` against the bytes/s the shaped scenario's learners carried on their links.

For every atoll run of scenario d in the peer benchmark's results: the learners' interface
bytes per second, up and down, in the middle half of the run (the first heals and the last
flush left out: the model is of steady training), and the step period the learners kept (the
median time between steps). The prediction is `atoll bandwidth`'s Decoupled average rate for
that run: the benchmark model's N, P = H = 24 (atoll's defaults), the int4 codec's bits per
value (`--codec int4`: its frames, zstd included, about 3.71; the nominal 4.25, int4 and one
bf16 scale per 64 values, over-predicted by 14%: BENCHMARKS.md §5) and `--framing` 1.069
(TCP/IP headers, atoll.bandwidth.model), per link and direction.

It leaves out the wire's fixed costs (`--message-bytes`, `--control-bps`: 0). Those were
calibrated by benchmarks/wire_overhead.py with TLS, 50 ms steps and fragments of 0.8-5.1 kB on
average (430-460 B per exchange, 2.8-4.0 kbit/s of heartbeats, BENCHMARKS.md §7); this
scenario runs without TLS, at about 0.75 s per step, on fragments of about 17 kB. There, at
the calibrated values, they would be 4-5% of the prediction; they are not calibrated for it,
so they are not added.

    python benchmarks/peer/bandwidth_check.py benchmarks/results/peer

Writes bandwidth_check.json beside results.json.
"""

from __future__ import annotations

import json
import statistics as st
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload as wl  # noqa: E402
from evaluate import progress  # noqa: E402

from atoll.bandwidth.model import WIRE_FRAMING  # noqa: E402


def step_period(rd: Path) -> float:
    """Median time between a learner's consecutive steps, over all learners."""
    gaps = []
    by: dict[int, list[float]] = {}
    for d in progress(rd):
        if "step" in d:
            by.setdefault(d["rank"], []).append(d["t"])
    for ts in by.values():
        gaps += [b - a for a, b in zip(ts, ts[1:], strict=False)]
    return st.median(gaps)


def middle_rate(timeline: list[dict], learners: int) -> tuple[float, float]:
    """Bytes/s per learner link, up (tx) and down (rx), between 25% and 75% of the run."""
    end = timeline[-1]["t"]
    pts = [x for x in timeline if 0.25 * end <= x["t"] <= 0.75 * end]
    a, b = pts[0], pts[-1]
    dt = b["t"] - a["t"]
    return (b["tx"] - a["tx"]) / dt / learners, (b["rx"] - a["rx"]) / dt / learners


def predicted(n_params: int, step_s: float, learners: int) -> float:
    """Bytes/s per link per direction from the `atoll bandwidth` command itself."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "atoll"), "bandwidth", "--params", str(n_params),
         "--step-s", str(step_s), "--datacenters", str(learners), "--codec", "int4",
         "--fragments", "24", "--H", "24", "--tau", "2", "--framing", str(WIRE_FRAMING),
         "--json", "/dev/stdout"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    doc = json.loads(out[out.index("{") :])
    return doc["methods"]["decoupled"]["average_gbps"] * 1e9 / 8


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/peer")
    res = json.loads((folder / "results.json").read_text())
    w = wl.Work(**res["work"])
    n = sum(p.numel() for p in wl.build_model(w).parameters())
    rows = []
    for r in res["runs"]:
        if r["system"] != "atoll" or r["scenario"] != "d" or not r.get("link_timeline"):
            continue
        s = step_period(folder / Path(r["dir"]).name)
        up, down = middle_rate(r["link_timeline"], w.learners)
        pred = predicted(n, s, w.learners)
        rows.append({"repeat": r["repeat"], "step_s": s, "up_Bps": up, "down_Bps": down,
                     "predicted_Bps": pred, "up_ratio": up / pred,
                     "down_ratio": down / pred})  # fmt: skip
        print(f"repeat {r['repeat']}: step {s:.3f} s; per link up {up / 1e3:.1f} kB/s, down "
              f"{down / 1e3:.1f} kB/s; atoll bandwidth {pred / 1e3:.1f} kB/s "
              f"(measured/predicted {up / pred:.3f} up, {down / pred:.3f} down)")  # fmt: skip
    if rows:
        med = {k: st.median(x[k] for x in rows) for k in ("up_ratio", "down_ratio")}
        print(f"median measured/predicted: up {med['up_ratio']:.3f}, down {med['down_ratio']:.3f}")
        (folder / "bandwidth_check.json").write_text(
            json.dumps({"runs": rows, "median": med}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
