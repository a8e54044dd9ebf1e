"""Learner overhead: step time of the built-in model with `learner.step` vs the same loop
without atoll, measured side by side in one process.

Method: benchmarks/sidebyside.py (the same model, optimizer and data in alternating blocks of
`--steps-per-block` steps, plain and atoll; per repeat the median over block pairs of the
ratio of median step times). Here:
- `--repeats` times over, each with a fresh syncer, model and learner; the headline is the
  median over repeats. The learner receives the merged updates in the background and sends
  fragments (P = H = 24).
- Schedule: `push` (this benchmark's default) sends exactly one fragment per step, which is
  also the steady rate of the library's default `pull` schedule in a loop that never pauses.
  Here the atoll learner does pause (during the plain blocks), so under `pull` the step time
  it reports includes those pauses, the syncer's clock slows down, and the atoll loop sends
  only about 0.7 fragments per step, in bursts: `--schedule pull` measures a lighter load.

    .venv/bin/python benchmarks/learner_overhead.py [--comm process|thread]
        [--schedule push|pull] [--repeats 3 --blocks 24 --steps-per-block 20]
        [--out benchmarks/results/learner_overhead.json]

Writes the JSON and a PNG (step-time ratio per block pair, one line per repeat) next to it.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sidebyside import alternate, finish_plot, machine, overheads, start_syncer, stop_syncer  # noqa: E402


def one_repeat(args: argparse.Namespace) -> dict:
    from atoll.config import SimConfig
    from atoll.live.client import status
    from atoll.live.learner import Learner, LearnerOptions
    from atoll.model.recipe import load_corpus, new_model
    from atoll.model.train import DataStream, new_inner_optimizer, train_step

    cfg = SimConfig()
    secret = secrets.token_hex(16)
    run_dir = Path(tempfile.mkdtemp(prefix="atoll-overhead-"))
    sets = ["learners=1", f"schedule={args.schedule}"]
    syncer, addr = start_syncer(run_dir, "bench", secret, sets)
    try:
        model = new_model(cfg)
        opt = new_inner_optimizer(model, cfg)
        data = DataStream(cfg, load_corpus(cfg), 0)
        opts = LearnerOptions(learner_id="B0", run_id="bench", secret=secret, comm=args.comm,
                              switch_interval_s=args.switch_interval)  # fmt: skip
        learner = Learner(model, opt, addr, opts)
        tokens = cfg.batch * cfg.context
        call_times: list[float] = []

        def plain_step() -> float:
            t = time.perf_counter()
            train_step(model, opt, data.next(), cfg.lr)
            return time.perf_counter() - t

        def atoll_step() -> float:
            t = time.perf_counter()
            train_step(model, opt, data.next(), cfg.lr)
            t1 = time.perf_counter()
            learner.step(tokens=tokens)
            t2 = time.perf_counter()
            call_times.append(t2 - t1)
            return t2 - t

        for _ in range(args.warmup):
            plain_step()
            atoll_step()
        plain, with_atoll = alternate(args.blocks, args.steps_per_block, plain_step, atoll_step)
        learner.close()
        rounds = status(addr, "bench", secret).rounds
    finally:
        stop_syncer(syncer)
    return {
        **overheads(plain, with_atoll),
        "median_learner_step_call_ms": 1e3 * statistics.median(call_times),
        "rounds_merged_by_syncer": rounds,
        "pulls_received": learner.pulls,
        "bytes_up": learner.bytes_up,
        "bytes_down": learner.bytes_down,
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, r in enumerate(result["repeats"]):
        pct = [100 * (x - 1) for x in r["block_ratios"]]
        med = 100 * r["overhead_paired_median"]
        ax.plot(pct, marker="o", ms=3, lw=1, label=f"repeat {i + 1}: median {med:+.1f}%")
    ax.axhline(100 * result["overhead_median"], color="k", lw=1.5,
               label=f"median over repeats {100 * result['overhead_median']:+.1f}%")  # fmt: skip
    title = f"learner overhead, comm={result['comm']}, schedule={result['schedule']}"
    finish_plot(fig, ax, path, "block pair", "atoll / plain step time - 1 (%)", title)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps-per-block", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--schedule", choices=("pull", "push"), default="push")
    ap.add_argument("--comm", choices=("thread", "process"), default="process")
    ap.add_argument(
        "--switch-interval", type=float, default=2e-4, help="thread mode: GIL switch interval (s)"
    )
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/learner_overhead.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    from atoll.config import SimConfig

    cfg = SimConfig()
    repeats = []
    for i in range(args.repeats):
        r = one_repeat(args)
        repeats.append(r)
        print(f"repeat {i + 1}/{args.repeats}: overhead {100 * r['overhead_paired_median']:+.2f}% "
              f"(of medians {100 * r['overhead_of_medians']:+.2f}%), learner.step "
              f"{r['median_learner_step_call_ms']:.3f} ms, plain step "
              f"{r['median_step_plain_ms']:.2f} ms", flush=True)  # fmt: skip
    result = {
        "what": "step time of the built-in model: loop + learner.step vs the same loop without "
        "atoll; per repeat the median over block pairs of (atoll / plain median step time) - 1",
        "command": "benchmarks/learner_overhead.py "
        f"--steps-per-block {args.steps_per_block} --blocks {args.blocks} "
        f"--repeats {args.repeats} --schedule {args.schedule} --comm {args.comm} "
        f"--switch-interval {args.switch_interval}",
        "schedule": args.schedule,
        "comm": args.comm,
        "overhead_median": statistics.median(r["overhead_paired_median"] for r in repeats),
        "overhead_repeats": [r["overhead_paired_median"] for r in repeats],
        "overhead_of_medians_repeats": [r["overhead_of_medians"] for r in repeats],
        "median_learner_step_call_ms": statistics.median(
            r["median_learner_step_call_ms"] for r in repeats
        ),
        "median_step_plain_ms": statistics.median(r["median_step_plain_ms"] for r in repeats),
        "steps_each_per_repeat": args.blocks * args.steps_per_block,
        "repeats": repeats,
        "model": {"n_layer": cfg.n_layer, "d_model": cfg.d_model, "batch": cfg.batch,
                  "context": cfg.context, "P": cfg.P, "H": cfg.H, "codec": cfg.codec},
        "torch_threads": 1,
        "machine": machine(1),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    plot(result, args.out.with_suffix(".png"))
    print(
        f"overhead (median over {args.repeats} repeats): {100 * result['overhead_median']:+.2f}%"
        f"  repeats: {[round(100 * x, 2) for x in result['overhead_repeats']]}"
        f"  -> {args.out} and {args.out.with_suffix('.png')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
