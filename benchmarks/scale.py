"""Models of real size: the built-in GPT (atoll.model.gpt, byte vocabulary) at about 1M, 10M,
30M and 100M parameters (300M and 1B for a GPU), through one training loop with and without
`atoll.Learner`, side by side.

Per size, in a process of its own (benchmarks/scale_worker.py; so that its peak memory is its
own):
- the model (`--batch` x `--context` tokens a step, AdamW, `--threads` torch threads; on
  `--device cuda` bf16 autocast and a synchronize after every step), `--warmup` plain steps:
  the plain loop's peak RSS;
- `atoll.save_init` and an `atoll syncer --init` process started from those weights (nice 19,
  on `--comm-cpus`; push schedule: one fragment sent per step, P = H = 24);
- `Learner()` with the same weights: a join whose digests match, no model downloaded (`join`);
  closed, one plain step taken, and `Learner()` again (the same learner id, a new
  incarnation): its weights now differ, so the heal sends every fragment (int8) (`heal`, with
  its bytes). The communication side runs in a child process (`comm="process"`), moved to
  `--comm-cpus`; the training process stays on `--train-cpus` (both as `taskset` would);
- `--repeats` block pairs of at least `--steps` steps each (more for small models: a block
  lasts `--min-block-s`), plain and atoll alternating, order swapped every pair
  (benchmarks/sidebyside.py): the overhead is the median over pairs of the ratio of median
  step times, minus 1; the same from the training thread's CPU time (steadier on a shared
  machine: it leaves out time other processes took); tokens/s, and MFU on a known GPU;
- peak RSS (VmHWM) of the training process, its communication child and the syncer; the CPU
  time the child and the syncer took per atoll step; on a GPU, its peak memory per side.

    .venv/bin/python benchmarks/scale.py [--sizes 1M,10M,30M,100M] [--steps 10] [--repeats 5]
        [--train-cpus 0 --comm-cpus 1] [--device cuda --batch 32 --context 1024 --nproc 1]
        [--out benchmarks/results/scale/scale.json]

`--nproc N` (N > 1) runs each size under torchrun as one island of N ranks (data parallel
inside it; every rank calls `atoll.Learner`, rank 0 talks to the syncer): it needs a Learner
that takes torch.distributed ranks. Writes the JSON and a plot (overhead, join and heal time,
peak memory against parameter count) next to it, scale.png. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from scale_worker import SIZES  # noqa: E402
from sidebyside import machine  # noqa: E402

MB = 1 << 20


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["sizes"]
    n = [r["params"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    ax.plot(n, [100 * r["overhead_paired_median"] for r in rows], "o-", label="median of pairs")
    ax.plot(n, [100 * r["overhead_of_medians"] for r in rows], "s--", ms=4, label="of medians")
    cpu = [100 * r["thread_cpu"]["overhead_paired_median"] for r in rows]
    ax.plot(n, cpu, "^:", label="training thread's CPU time, median of pairs")
    ax.axhline(1, color="r", ls="--", lw=1, label="target 1%")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_ylabel("step time, atoll / plain - 1 (%)")
    ax.set_title("per-step overhead")
    ax = axes[1]
    joins = [(x, r["join_s"]) for x, r in zip(n, rows, strict=True) if r["join_s"] is not None]
    ax.plot(*zip(*joins, strict=True), "o-", label="join, digests match")
    ax.plot(n, [r["heal_s"] for r in rows], "s-", label="join with a full heal (int8)")
    ax.plot(n, [r["syncer_start_s"] for r in rows], "^:", label="syncer start (--init)")
    ax.set_ylabel("seconds")
    ax.set_yscale("log")
    ax.set_title("Learner() until it returns")
    ax = axes[2]
    for key, label in (("peak_rss_plain_bytes", "training process, plain loop"),
                       ("peak_rss_learner_bytes", "training process, with atoll"),
                       ("peak_rss_comm_child_bytes", "communication child"),
                       ("peak_rss_syncer_bytes", "syncer")):  # fmt: skip
        ax.plot(n, [r[key] / MB for r in rows], "o-", label=label)
    ax.plot(n, [4 * x / MB for x in n], "k:", lw=1, label="one fp32 copy of the model")
    ax.set_ylabel("peak RSS (MiB)")
    ax.set_yscale("log")
    ax.set_title("peak memory")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(rows: list[dict]) -> str:
    """The figures per size, one line each."""

    def mib(r: dict, key: str) -> str:
        return f"{r[key] / MB:.0f}"

    head = (
        "size",
        "params",
        "plain ms",
        "overhead",
        "CPU",
        "step call ms",
        "join s",
        "heal s",
        "heal MiB",
        "RSS plain",
        "learner",
        "child",
        "syncer",
        "tokens/s",
        "MFU",
    )
    lines = [" | ".join(head)]
    for r in rows:
        mfu = (
            f"{100 * r['mfu_plain']:.1f}% / {100 * r['mfu_atoll']:.1f}%"
            if "mfu_plain" in r
            else "-"
        )
        join = "-" if r["join_s"] is None else f"{r['join_s']:.2f}"
        lines.append(" | ".join((
            r["size"], f"{r['params'] / 1e6:.1f}M", f"{r['median_step_plain_ms']:.1f}",
            f"{100 * r['overhead_paired_median']:+.2f}%",
            f"{100 * r['thread_cpu']['overhead_paired_median']:+.2f}%",
            f"{r['median_learner_step_call_ms']:.2f}", join, f"{r['heal_s']:.2f}",
            f"{r['heal_bytes_down'] / MB:.1f}", mib(r, "peak_rss_plain_bytes"),
            mib(r, "peak_rss_learner_bytes"), mib(r, "peak_rss_comm_child_bytes"),
            mib(r, "peak_rss_syncer_bytes"),
            f"{r['tokens_per_s_plain']:.0f} / {r['tokens_per_s_atoll']:.0f}", mfu,
        )))  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1M,10M,30M,100M", help=f"of {', '.join(SIZES)}")
    ap.add_argument("--steps", type=int, default=10, help="steps per block, at least")
    ap.add_argument("--repeats", type=int, default=5, help="block pairs (plain, atoll) per size")
    ap.add_argument("--min-block-s", type=float, default=2.0, help="a block lasts at least this")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the training loop")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--amp", choices=("bf16", "none"), default="bf16", help="cuda only")
    ap.add_argument("--peak-tflops", type=float, help="per GPU, for MFU (default: known GPUs)")
    ap.add_argument("--nproc", type=int, default=1, help="ranks of the island (torchrun)")
    cpus = sorted(os.sched_getaffinity(0))
    ap.add_argument("--train-cpus", default=str(cpus[0]), help="e.g. 0 or 0-3; '' leaves all")
    ap.add_argument("--comm-cpus", default=str(cpus[-1]), help="the comm child and the syncer")
    ap.add_argument("--syncer-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting of the syncer (e.g. snapshot_every_s=600)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=HERE / "results/scale/scale.json")
    args = ap.parse_args()
    sizes = args.sizes.split(",")
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        ap.error(f"--sizes: {bad[0]!r} is not allowed: one of {', '.join(SIZES)}")
    if args.nproc < 1:
        ap.error(f"--nproc: {args.nproc} is not allowed: at least 1")
    rows, started = [], time.time()
    for size in sizes:
        out = Path(tempfile.mkstemp(prefix="atoll-scale-", suffix=".json")[1])
        cmd = [sys.executable]
        if args.nproc > 1:
            cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}"]
        cmd += [str(HERE / "scale_worker.py"), "--size", size, "--out", str(out)]
        for k in ("steps", "repeats", "min_block_s", "warmup", "batch", "context", "threads",
                  "device", "amp", "peak_tflops", "train_cpus", "comm_cpus"):  # fmt: skip
            if getattr(args, k) is not None:
                cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
        for kv in args.syncer_set:
            cmd += ["--syncer-set", kv]
        subprocess.run(cmd, check=True)
        rows.append(json.loads(out.read_text()))
        out.unlink()
    result = {
        "what": "the built-in GPT at several sizes, one training loop with and without "
        "atoll.Learner (comm='process', push schedule, P = H = 24), alternating blocks; "
        "overhead = median over block pairs of (atoll / plain median step time) - 1",
        "command": "benchmarks/scale.py " + " ".join(sys.argv[1:]),
        "wall_s": time.time() - started,
        "train_cpus": args.train_cpus, "comm_cpus": args.comm_cpus,
        "machine": machine(args.threads),
        "sizes": rows,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    plot(result, args.out.with_suffix(".png"))
    print(table(rows))
    print(f"-> {args.out} and {args.out.with_suffix('.png')} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
