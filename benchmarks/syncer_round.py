"""One syncer round as the syncer runs it, beside a memory copy of the same bytes.

A real `SyncerProtocol` (one fragment of N values in 8 tensors, M joined learners, push
schedule, quorum M, no grace, the default settings otherwise: RDA, outer sgd, down codec
int4, magnitude guard on and warm) is handed M contributions of the run's codec; the M-th
closes the round. Timed: the M `prepare` calls (crc, decompression, the frame's measure: what
the service's receiving threads do before they take the lock, here on --threads threads), the
M `on_contribution` calls (header checks, decode or hold, magnitude guard) and the close
(merge, light-round scale, outer step, broadcast encode, public value, history). The tape
record is written by the driver and is not included.

The bytes a round must read and write (its floor, whatever the implementation):
    M frames in + the base (4N) + Theta in and out (8N) + the public value in and out (8N)
    + the history copy out (4N) + the broadcast frame out
The memory copy moves the same traffic: a copy of half those bytes (it reads and writes each).
`rate` = copy time / round time (1.0: the round runs at memory speed).

    PYTHONPATH=src python benchmarks/syncer_round.py [--sizes 1M,4M,16M] [--ms 2,4,8,16]
        [--codecs int4,int8,bf16] [--repeats 5] [--threads 1] [--out FILE] [--label before]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from atoll.core import codec
from atoll.core.events import Event, RoundClosed
from atoll.core.fragments import make_plan
from atoll.core.messages import Contribution
from atoll.core.syncer import SyncerProtocol
from atoll.core.syncer_config import SyncerConfig

OUT = Path(__file__).parent / "results" / "syncer_round"
TENSORS = 8


def _size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(s.rstrip("KMG")) * mult


def floor_bytes(n: int, frames: list[bytes], bcast: int) -> int:
    return sum(len(f) for f in frames) + 4 * n + 8 * n + 8 * n + 4 * n + bcast


def setup(n: int, m: int, scheme: str, path: str = "fused", threads: int = 1, seed: int = 0):
    shapes = {f"t{i}": (n // TENSORS,) for i in range(TENSORS)}
    plan = make_plan(shapes, P=1, H=1)
    g = torch.Generator().manual_seed(seed)
    init = torch.randn(n, generator=g)
    cfg = SyncerConfig(
        quorum=m,
        grace=False,
        schedule="push",
        history=2,
        codec=scheme,
        fused="on" if path == "fused" else "off",
        syncer_threads=str(threads),
    )
    syncer = SyncerProtocol(plan, [init], cfg)
    for i in range(m):
        syncer.on_join(0.0, f"L{i}")
    frames = [codec.encode(0.01 * torch.randn(n, generator=g), scheme) for _ in range(m)]
    return syncer, frames


def one_round(
    syncer: SyncerProtocol, frames: list[bytes], now: float, pool: ThreadPoolExecutor | None = None
) -> tuple[float, int]:
    v = syncer.version[0]
    cs = [
        Contribution(f"L{i}", 0, int(now), v, f, 4, 4096, now, 0.1, 0.4)
        for i, f in enumerate(frames)
    ]
    t0 = time.perf_counter()
    cs = list(pool.map(syncer.prepare, cs)) if pool else [syncer.prepare(c) for c in cs]
    out: list = []
    for c in cs:
        out += syncer.on_contribution(now, c)
    dt = time.perf_counter() - t0
    closed = [o.data for o in out if isinstance(o, Event) and isinstance(o.data, RoundClosed)]
    if len(closed) != 1:
        raise RuntimeError(f"the round did not close: {[type(o).__name__ for o in out]}")
    return dt, closed[0].bytes_out // m_live(syncer)


def m_live(syncer: SyncerProtocol) -> int:
    return max(len(syncer.live), 1)


def copy_time(nbytes: int, repeats: int) -> float:
    src = torch.empty(max(nbytes // 2, 1), dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def measure(n: int, m: int, scheme: str, repeats: int, path: str, threads: int) -> dict:
    syncer, frames = setup(n, m, scheme, path, threads)
    ts, bcast = [], 0
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    for r in range(repeats + 2):  # two warm-up rounds (the guard warms up over 8 accepts)
        dt, bcast = one_round(syncer, frames, float(r + 1), pool)
        if r >= 2:
            ts.append(dt)
    nbytes = floor_bytes(n, frames, bcast)
    t_round = statistics.median(ts)
    t_copy = copy_time(nbytes, max(repeats, 5))
    return {
        "numel": n,
        "M": m,
        "codec": scheme,
        "path": path,
        "threads": threads,
        "ns_per_value": 1e9 * t_round / (n * m),
        "round_s": t_round,
        "rounds_s": ts,
        "copy_s": t_copy,
        "bytes": nbytes,
        "frame_bytes": len(frames[0]),
        "round_GBps": nbytes / t_round / 1e9,
        "copy_GBps": nbytes / t_copy / 1e9,
        "rate": t_copy / t_round,
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["numel"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.5 * len(sizes), 3.6), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        for scheme in sorted({r["codec"] for r in rows}):
            for way in sorted({r["path"] for r in rows}):
                rs = sorted((r for r in rows if r["numel"] == n and r["codec"] == scheme
                             and r["path"] == way), key=lambda r: r["M"])  # fmt: skip
                style = "o-" if way == "fused" else "s:"
                ax.plot([r["M"] for r in rs], [r["rate"] for r in rs], style,
                        label=f"{scheme} {way}")  # fmt: skip
        ax.axhline(0.5, color="grey", ls="--", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{n / (1 << 20):g}M values")
        ax.set_xlabel("contributions M")
        ax.set_ylabel("copy time / round time")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,4M,16M")
    ap.add_argument("--ms", default="2,4,8,16")
    ap.add_argument("--codecs", default="int4,int8,bf16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch's and the kernels' threads")
    ap.add_argument("--path", default="fused,reference", help="fused and/or reference")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=OUT / "syncer_round.json")
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    cases = [(_size(s), int(m), c, path) for s in a.sizes.split(",") for m in a.ms.split(",")
             for c in a.codecs.split(",") for path in a.path.split(",")]  # fmt: skip
    rows = []
    for k, (n, m, scheme, path) in enumerate(cases, 1):
        r = measure(n, m, scheme, a.repeats, path, a.threads)
        rows.append(r)
        print(
            f"[{k}/{len(cases)}] {n / (1 << 20):g}M M={m} {scheme} {path}: round "
            f"{r['round_s'] * 1e3:.1f} ms ({r['ns_per_value']:.2f} ns per contributed value), "
            f"copy {r['copy_s'] * 1e3:.1f} ms, rate {r['rate']:.3f}",
            file=sys.stderr,
            flush=True,
        )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "label": a.label,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "repeats": a.repeats,
        "settings": dataclasses.asdict(SyncerConfig()),
        "rows": rows,
    }
    a.out.write_text(json.dumps(doc, indent=1))
    if not a.no_plot:
        plot(rows, a.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
