"""Throughput of a sharded syncer: S = 1, 2, 4 shards side by side on a syncer-bound setup.

Each run is benchmarks/load.py with the same settings and only --shards changed: a few good
clients, no misbehaving ones, a short step time (the pull clock's nominal rate, 1/step_s
rounds/s, is far above what the syncer merges) and a larger built-in model (--d-model,
--n-layer), so the syncer's merge work bounds the round rate. The runs are interleaved
(1, 2, 4, 1, 2, 4, ...) so a slow stretch of the machine hits every S alike; medians over
--repeats. Nothing is pinned: the shards and the clients share the machine's CPUs.

Reported per S: rounds/s, values/s (fragment values that closed rounds published), merged
values/s (those times the round's participants: the merge work done), their ratio to S=1,
each shard's rounds/s and merged values/s, the CPU seconds each shard used in the measured
window, learners per round and round latency (load.py's definitions).

    nice -n 15 .venv/bin/python benchmarks/shard_throughput.py

Writes benchmarks/results/shard_throughput.json and .png (--out, --plot).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = ap.add_argument
    add("--shards", default="1,2,4", help="the shard counts, comma-separated")
    add("--repeats", type=int, default=3, help="runs per shard count (medians)")
    add("--seconds", type=float, default=20.0, help="each run's length (load.py --seconds)")
    add("--warmup-s", type=float, default=5.0, help="left out of every rate")
    add("--clients", type=int, default=4)
    add("--procs", type=int, default=2, help="client worker processes")
    add("--step-s", type=float, default=0.02, help="the clients' step time: the pull clock")
    add("--d-model", type=int, default=512)
    add("--n-layer", type=int, default=8)
    add("--out", type=Path, default=HERE / "results" / "shard_throughput.json")
    add("--plot", type=Path, default=HERE / "results" / "shard_throughput.png")
    args = ap.parse_args()
    args.counts = [int(x) for x in args.shards.split(",")]
    return args


def one_run(args: argparse.Namespace, shards: int, tmp: Path, k: int) -> dict:
    out = tmp / f"s{shards}-{k}.json"
    cmd = [sys.executable, str(HERE / "load.py"), "--shards", str(shards), "--bad", "0"]
    cmd += ["--clients", str(args.clients), "--procs", str(args.procs), "--no-pin"]
    cmd += ["--seconds", str(args.seconds), "--warmup-s", str(args.warmup_s)]
    cmd += ["--step-s", str(args.step_s), "--d-model", str(args.d_model)]
    cmd += [
        "--n-layer",
        str(args.n_layer),
        "--out",
        str(out),
        "--plot",
        str(out.with_suffix(".png")),
    ]
    t = time.time()
    log = out.with_suffix(".log")
    with open(log, "w") as fh:
        rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if rc != 0 or not out.exists():
        raise SystemExit(f"load.py --shards {shards} failed (exit {rc}): see {log}")
    rep = json.loads(out.read_text())
    shutil.rmtree(rep["run_dir"], ignore_errors=True)  # tapes and snapshots of a 100 MB model
    a = rep["phases"]["all"]
    row = {
        "shards": shards,
        "wall_s": round(time.time() - t, 1),
        "rounds_per_s": a["rounds_per_s"],
        "values_per_s": a["values_per_s"],
        "merged_values_per_s": a["merged_values_per_s"],
        "participants_mean": a["participants_mean"],
        "latency_ms": a["latency_ms"],
        "syncer_cpu_s": rep["syncer"]["cpu_s"],
        "clients_cpu_s": rep["clients_cpu"]["cpu_s"],
        "good_errors": rep["good"]["errors"],
        "per_shard": [
            {
                "fragments": s["fragments"],
                "rounds_per_s": s["phases"]["all"]["rounds_per_s"],
                "merged_values_per_s": s["phases"]["all"]["merged_values_per_s"],
                "cpu_s": s["cpu_s"],
                "peak_rss_mb": s["peak_rss_mb"],
            }
            for s in rep["shards"]
        ],
        "window_s": a["seconds"],
        "params": rep["model"]["params"],
    }
    print(
        f"S={shards} run {k}: {row['rounds_per_s']:.2f} rounds/s, "
        f"{row['merged_values_per_s'] / 1e6:.1f} M merged values/s, "
        f"syncer CPU {row['syncer_cpu_s']:.1f} s, per shard "
        f"{[x['cpu_s'] for x in row['per_shard']]} s, clients {row['clients_cpu_s']} s "
        f"({row['wall_s']:.0f} s wall)",
        flush=True,
    )
    return row


def summarize(rows: list[dict], counts: list[int]) -> list[dict]:
    med = statistics.median
    out = []
    for s in counts:
        rs = [r for r in rows if r["shards"] == s]
        out.append(
            {
                "shards": s,
                "runs": len(rs),
                "rounds_per_s": med(r["rounds_per_s"] for r in rs),
                "values_per_s": med(r["values_per_s"] for r in rs),
                "merged_values_per_s": med(r["merged_values_per_s"] for r in rs),
                "participants_mean": med(r["participants_mean"] for r in rs),
                "latency_p50_ms": med(r["latency_ms"]["p50"] for r in rs),
                "latency_p99_ms": med(r["latency_ms"]["p99"] for r in rs),
                "syncer_cpu_s": med(r["syncer_cpu_s"] for r in rs),
                "syncer_cores": med(r["syncer_cpu_s"] / r["window_s"] for r in rs),
                "clients_cpu_s": med(r["clients_cpu_s"] for r in rs),
                "per_shard_rounds_per_s": [
                    med(r["per_shard"][i]["rounds_per_s"] for r in rs) for i in range(s)
                ],
                "per_shard_merged_values_per_s": [
                    med(r["per_shard"][i]["merged_values_per_s"] for r in rs) for i in range(s)
                ],
                "per_shard_cpu_s": [med(r["per_shard"][i]["cpu_s"] for r in rs) for i in range(s)],
                "per_shard_fragments": rs[0]["per_shard"]
                and [x["fragments"] for x in rs[0]["per_shard"]],
                "good_errors": sum(r["good_errors"] for r in rs),
            }
        )
    base = out[0]
    for x in out:
        x["ratio_rounds"] = round(x["rounds_per_s"] / base["rounds_per_s"], 2)
        x["ratio_merged_values"] = round(x["merged_values_per_s"] / base["merged_values_per_s"], 2)
    return out


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ, rows = res["summary"], res["runs"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = [s["shards"] for s in summ]
    a.bar([str(x) for x in xs], [s["merged_values_per_s"] / 1e6 for s in summ], color="C0")
    for r in rows:
        a.plot(str(r["shards"]), r["merged_values_per_s"] / 1e6, "k.", ms=5)
    for s in summ:
        y = s["merged_values_per_s"] / 1e6
        a.annotate(
            f"{s['ratio_merged_values']:.2f}x", (str(s["shards"]), y), ha="center", va="bottom"
        )
    a.set(xlabel="shards", ylabel="merged values/s (M), median and runs")
    a.set_title("throughput (target: 1.7x at 2, 3x at 4)", fontsize=10)
    bottom = [0.0] * len(xs)
    for i in range(max(xs)):
        h = [s["per_shard_cpu_s"][i] if i < len(s["per_shard_cpu_s"]) else 0 for s in summ]
        b.bar([str(x) for x in xs], h, bottom=bottom, label=f"shard {i}")
        bottom = [u + v for u, v in zip(bottom, h, strict=True)]
    b.bar([str(x) for x in xs], [s["clients_cpu_s"] for s in summ], bottom=bottom, color="0.7",
          label="clients (whole run)")  # fmt: skip
    w = summ[0]["syncer_cpu_s"] / summ[0]["syncer_cores"]
    b.axhline(res["cpus"] * w, c="r", ls="--", lw=0.8, label=f"{res['cpus']} cores x window")
    b.set(xlabel="shards", ylabel="CPU seconds in the measured window")
    b.legend(fontsize=7)
    cfg = res["config"]
    fig.suptitle(
        f"atoll sharded syncer, {res['params'] / 1e6:.1f}M params, {cfg['clients']} clients, "
        f"step {cfg['step_s']} s, {res['cpus']} CPUs shared by shards and clients",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    args = parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="atoll-shard-tp-"))
    rows, t0 = [], time.time()
    for k in range(args.repeats):
        for s in args.counts:
            rows.append(one_run(args, s, tmp, k))
    summ = summarize(rows, args.counts)
    cfg = {k: v for k, v in vars(args).items() if k not in ("out", "plot")}
    res = {
        "config": cfg,
        "cpus": len(os.sched_getaffinity(0)),
        "params": rows[0]["params"],
        "nominal_rounds_per_s": round(1 / args.step_s, 1),
        "summary": summ,
        "runs": rows,
        "wall_s": round(time.time() - t0, 1),
        "logs": str(tmp),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    plot(res, args.plot)
    print("| shards | rounds/s | x S=1 | merged values/s | x S=1 | per shard rounds/s "
          "| per shard CPU s | learners/round | latency p50/p99 ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for s in summ:
        print(
            f"| {s['shards']} | {s['rounds_per_s']:.2f} | {s['ratio_rounds']:.2f} "
            f"| {s['merged_values_per_s'] / 1e6:.1f} M | {s['ratio_merged_values']:.2f} "
            f"| {' / '.join(f'{x:.2f}' for x in s['per_shard_rounds_per_s'])} "
            f"| {' / '.join(f'{x:.1f}' for x in s['per_shard_cpu_s'])} "
            f"| {s['participants_mean']:.2f} "
            f"| {s['latency_p50_ms']:.0f} / {s['latency_p99_ms']:.0f} |"
        )
    print(f"wrote {args.out} and {args.plot} ({res['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
