"""Syncer memory over a long run: the live syncer's protocol (atoll.core.syncer.SyncerProtocol,
the object the syncer service drives under its lock) fed synthetic int4 contributions in
process, its resident memory (VmRSS) sampled after every round, against the formula
`atoll.core.memory.memory_bytes`.

Each mode runs in a fresh process (one torch thread; `MALLOC_MMAP_THRESHOLD_` fixed at 64 KiB
so that freed fragment-sized buffers go back to the system rather than to glibc's heap, whose
dynamic threshold otherwise keeps them: what a deployment should set too):
- `plain`: history_full_every = 1, every kept version in fp32 (the representation before);
- `frames`: the default, older versions as the broadcast int4 frames, a full one every 16;
- `bytes`: the default plus history_bytes = 4 fp32 copies of the model (about 15 versions);
- `frames0`: history_full_every = 0, frames only (older versions resolved backward from the
  newest, core/history.py);
- `frames0_h4`: frames only and history = 4 (bases up to 3 versions old, as fed here).
M learners each contribute to every round, on a base 0-3 versions old (resolved from the
history), with the same pre-encoded int4 payloads (content does not matter to memory).
The process's baseline (Python, torch, codec warmed up, the fused round's kernels loaded as the
syncer loads them at its start: numba, about 136 MB; before any model-sized tensor) is
measured and added to the formula's prediction.

    .venv/bin/python benchmarks/syncer_memory.py [--values 4000000 --P 4 --M 4 --rounds 130]
        [--modes plain,frames,bytes] [--out benchmarks/results/syncer_memory]

Writes syncer_memory.json and syncer_memory.png there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = {
    "plain": {"history_full_every": 1},
    "frames": {},
    "bytes": {"history_bytes": "4x"},
    "frames0": {"history_full_every": 0},
    "frames0_h4": {"history_full_every": 0, "history": 4},
}


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def worker(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(1)
    from atoll.core import codec
    from atoll.core.fragments import make_plan
    from atoll.core.memory import memory_bytes
    from atoll.core.messages import Contribution
    from atoll.core.syncer import SyncerConfig, SyncerProtocol

    codec.decode(codec.encode(torch.randn(4096), "int4"))  # warm the codec's paths
    N, P, M = args.values, args.P, args.M
    n = N // P
    from atoll.core import fused

    fused.kernels(n)  # the round's kernels, as the syncer loads them at its start (numba: fixed)
    base = rss()
    plan = make_plan({f"w{p}": (n,) for p in range(P)}, P=P, H=P)
    kw = dict(MODES[args.mode])
    if kw.get("history_bytes") == "4x":
        kw["history_bytes"] = 4 * 4 * N
    cfg = SyncerConfig(quorum=M, grace=False, schedule="push", outer="sgd", **kw)
    gen = torch.Generator().manual_seed(0)
    syncer = SyncerProtocol(plan, [torch.randn(n, generator=gen) for _ in range(P)], cfg)
    payloads = [codec.encode(0.01 * torch.randn(n, generator=gen), "int4") for _ in range(4)]
    for m in range(M):
        syncer.on_join(0.0, f"L{m}")
    samples, seq, t0 = [], 0, time.perf_counter()
    for r in range(args.rounds):
        for p in range(P):
            v = syncer.version[p]
            for m in range(M):
                seq += 1
                base_v = max(0, v - (seq % 4))  # bases 0-3 versions old
                c = Contribution(
                    f"L{m}", p, seq, base_v, payloads[seq % 4], steps=1, tokens=10,
                    sent_at=float(seq), step_time=1.0,
                )  # fmt: skip
                syncer.on_contribution(float(seq), c)
            assert syncer.version[p] == v + 1, "the round did not close"
        samples.append((r + 1, round(time.perf_counter() - t0, 2), rss()))
    hist = syncer.history.nbytes()
    settings = {
        "history": cfg.history,
        "full_every": cfg.history_full_every,
        "history_bytes": cfg.history_bytes,
    }
    formula = memory_bytes(N, P, M, **settings, base_bytes=base)
    return {
        "mode": args.mode,
        "settings": settings,
        "baseline_rss": base,
        "history_nbytes_end": hist,
        "formula": formula,
        "samples": samples,
    }


MB = 2**20


def summarize(res: dict) -> dict:
    s = res["samples"]
    tail = [x[2] for x in s[int(0.7 * len(s)) :]]  # the last 30% of rounds (warm)
    half = [x[2] for x in s[len(s) // 2 :]]
    first, last = half[: len(half) // 4 or 1], half[-(len(half) // 4 or 1) :]
    return {
        "plateau_mb": round(statistics.median(tail) / 2**20, 1),
        "max_mb": round(max(x[2] for x in s) / 2**20, 1),
        "drift_last_half_mb": round((statistics.median(last) - statistics.median(first)) / MB, 1),
        "steady_pred_mb": round(res["formula"]["steady"] / 2**20, 1),
        "round_peak_pred_mb": round(res["formula"]["round_peak"] / 2**20, 1),
        "history_pred_mb": round(res["formula"]["history"] / 2**20, 1),
        "history_held_mb": round(res["history_nbytes_end"] / 2**20, 1),
        "baseline_mb": round(res["baseline_rss"] / 2**20, 1),
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = ["tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange"]
    for res, color in zip(results, colors, strict=False):
        xs = [x[0] for x in res["samples"]]
        ax.plot(xs, [x[2] / 2**20 for x in res["samples"]], color=color, label=res["mode"])
        ax.axhline(res["formula"]["steady"] / 2**20, color=color, ls="--", lw=0.8)
        ax.axhline(res["formula"]["round_peak"] / 2**20, color=color, ls=":", lw=0.8)
    ax.set_xlabel("rounds of every fragment")
    ax.set_ylabel("syncer RSS (MiB)")
    ax.set_title("syncer memory (dashed: formula steady, dotted: round peak)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--values", type=int, default=4_000_000)
    ap.add_argument("--P", type=int, default=4)
    ap.add_argument("--M", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=130)
    ap.add_argument("--modes", default="plain,frames,bytes")
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="benchmarks/results/syncer_memory")
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(worker(args)))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    results = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            print(f"mode={mode!r}: one of {sorted(MODES)}", file=sys.stderr)
            return 2
        cmd = [sys.executable, __file__, "--mode", mode, "--values", str(args.values),
               "--P", str(args.P), "--M", str(args.M), "--rounds", str(args.rounds)]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        res = json.loads(done.stdout.strip().splitlines()[-1])
        res["summary"] = summarize(res)
        print(mode, res["summary"], flush=True)
        results.append(res)
    shape = {"values": args.values, "P": args.P, "M": args.M, "rounds": args.rounds}
    (out / "syncer_memory.json").write_text(json.dumps({**shape, "runs": results}, indent=1))
    plot(results, out / "syncer_memory.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
