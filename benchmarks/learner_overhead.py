"""Learner overhead: step time of the built-in model with `learner.step` vs the same loop
without atoll, measured side by side in one process (interleaved blocks, alternating order).

A syncer runs as a separate process on loopback (at nice 19: it stands for a remote host and
should not take this machine's cores from the loop being measured); the atoll loop's learner
sends one fragment per step (pull schedule, the default: when the syncer pulls it; push: on its
own step count) and receives the merged updates in its background threads.

    .venv/bin/python benchmarks/learner_overhead.py [--steps-per-block 25 --blocks 16]
        [--schedule pull|push] [--out benchmarks/results/learner_overhead.json]

Writes benchmarks/results/learner_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps-per-block", type=int, default=25)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--schedule", choices=("pull", "push"), default="pull")
    ap.add_argument("--comm", choices=("thread", "process"), default="thread")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/learner_overhead.json"))
    args = ap.parse_args()

    from atoll.live.client import wait_ready
    from atoll.live.learner import Learner
    from atoll.sim.config import SimConfig
    from atoll.sim.world import DataStream, corpus_for, new_inner_optimizer, new_model, train_step

    torch.set_num_threads(1)
    cfg = SimConfig()
    secret = secrets.token_hex(16)
    run_dir = Path(tempfile.mkdtemp(prefix="atoll-overhead-"))
    env = {**os.environ, "ATOLL_SECRET": secret}
    syncer = subprocess.Popen(
        [sys.executable, "-m", "atoll.cli", "syncer", "--run-dir", str(run_dir), "--run-id",
         "bench", "--no-budget", "--set", "learners=1", "--set", f"schedule={args.schedule}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        preexec_fn=lambda: os.nice(19),  # the syncer stands for a remote host: lowest priority
    )  # fmt: skip
    try:
        while not (run_dir / "syncer.addr").exists():
            if syncer.poll() is not None:
                raise RuntimeError("syncer exited")
            time.sleep(0.05)
        addr = (run_dir / "syncer.addr").read_text()
        wait_ready(addr, "bench", secret)
        corpus = corpus_for(cfg)
        plain_model, atoll_model = new_model(cfg), new_model(cfg)
        plain_opt = new_inner_optimizer(plain_model, cfg)
        atoll_opt = new_inner_optimizer(atoll_model, cfg)
        plain_data, atoll_data = DataStream(cfg, corpus, 0), DataStream(cfg, corpus, 0)
        learner = Learner(atoll_model, atoll_opt, addr, learner_id="B0", run_id="bench",
                          secret=secret, comm=args.comm)  # fmt: skip
        tokens = cfg.batch * cfg.context

        def plain_step() -> float:
            t = time.perf_counter()
            train_step(plain_model, plain_opt, plain_data.next(), cfg.lr)
            return time.perf_counter() - t

        call_times: list[float] = []

        def atoll_step() -> float:
            t = time.perf_counter()
            train_step(atoll_model, atoll_opt, atoll_data.next(), cfg.lr)
            t1 = time.perf_counter()
            learner.step(tokens=tokens)
            t2 = time.perf_counter()
            call_times.append(t2 - t1)
            return t2 - t

        for _ in range(args.warmup):
            plain_step()
            atoll_step()
        plain, with_atoll = [], []
        for b in range(args.blocks):
            order = [(plain, plain_step), (with_atoll, atoll_step)]
            if b % 2:
                order.reverse()
            for sink, fn in order:
                sink += [fn() for _ in range(args.steps_per_block)]
        learner.close()
        rounds = json.loads("{}")
        from atoll.live.client import status

        st = status(addr, "bench", secret)
        rounds = st.rounds
    finally:
        syncer.send_signal(signal.SIGTERM)
        syncer.wait(30)
    med_p, med_a = statistics.median(plain), statistics.median(with_atoll)
    result = {
        "what": "median step time of the built-in model, plain loop vs loop + learner.step",
        "command": "benchmarks/learner_overhead.py "
        f"--steps-per-block {args.steps_per_block} --blocks {args.blocks} "
        f"--schedule {args.schedule} --comm {args.comm}",
        "schedule": args.schedule,
        "comm": args.comm,
        "steps_each": len(plain),
        "median_step_plain_ms": 1e3 * med_p,
        "median_step_atoll_ms": 1e3 * med_a,
        "overhead_median": med_a / med_p - 1,
        "mean_step_plain_ms": 1e3 * statistics.fmean(plain),
        "mean_step_atoll_ms": 1e3 * statistics.fmean(with_atoll),
        "median_learner_step_call_ms": 1e3 * statistics.median(call_times),
        "rounds_merged_by_syncer": rounds,
        "pulls_received": learner.pulls,
        "median_pull_latency_ms": 1e3 * statistics.median(learner.pull_latency_s)
        if learner.pull_latency_s
        else None,
        "bytes_up": learner.bytes_up,
        "bytes_down": learner.bytes_down,
        "model": {"n_layer": cfg.n_layer, "d_model": cfg.d_model, "batch": cfg.batch,
                  "context": cfg.context, "P": cfg.P, "H": cfg.H, "codec": cfg.codec},
        "torch_threads": 1,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "torch": torch.__version__},
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in list(result)[2:13]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
