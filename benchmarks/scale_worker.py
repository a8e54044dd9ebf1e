"""One size of benchmarks/scale.py, in a process of its own (so that its peak memory is its
own); under `torchrun` one process per rank, an island of them (rank 0 reports).

    python benchmarks/scale_worker.py --size 100M --out result.json [--device cuda]
        [--steps 10 --repeats 5 --min-block-s 2 --warmup 3 --batch 4 --context 128]
        [--train-cpus 0 --comm-cpus 1] [--amp bf16] [--threads 1] [--syncer-set KEY=VALUE]

See scale.py for what it measures and how.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sidebyside import (  # noqa: E402
    alternate,
    cpu_seconds,
    overheads,
    peak_rss_bytes,
    start_syncer,
    stop_syncer,
)

# name -> (n_layer, d_model), heads of 64; about this many parameters (byte vocabulary)
SIZES = {"1M": (5, 128), "10M": (8, 320), "30M": (12, 448), "100M": (12, 832),
         "300M": (24, 1024), "1B": (24, 1856)}  # fmt: skip
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}  # dense bf16, per GPU
RUN = "scale"
MB = 1 << 20
RANK, WORLD = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def say(size: str, msg: str) -> None:
    if RANK == 0:
        print(f"[{size}] {msg}", file=sys.stderr, flush=True)


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process `pid` onto `cpus` (what `taskset -a -p` does)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass  # a thread that ended meanwhile


class Loop:
    """The one training loop both sides run: the same model, optimizer and data stream; a
    step of the atoll side is the same step followed by `learner.step`."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from atoll.config import SimConfig
        from atoll.model.gpt import GPT, GPTConfig
        from atoll.model.recipe import load_corpus
        from atoll.model.train import DataStream

        self.torch = torch
        local = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device(f"cuda:{local}" if args.device == "cuda" else args.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if WORLD > 1:
            from datetime import timedelta

            backend = "nccl" if self.device.type == "cuda" else "gloo"
            # rank 0 may wait long for the syncer's start and its heal (minutes at 1B) while
            # the other ranks wait in their first collective: not NCCL's 10-minute default
            torch.distributed.init_process_group(backend, timeout=timedelta(minutes=60))
        self.n_layer, self.d_model = SIZES[args.size]
        torch.manual_seed(0)
        gcfg = GPTConfig(context=args.context, n_layer=self.n_layer, n_head=self.d_model // 64,
                         d_model=self.d_model)  # fmt: skip
        self.model = GPT(gcfg).to(self.device)
        self.net = self.model
        if WORLD > 1:  # the island's ranks: data parallel inside it
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = DistributedDataParallel(self.model, device_ids=ids)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, betas=(0.9, 0.95),
                                     weight_decay=0.1)  # fmt: skip
        dcfg = SimConfig(batch=args.batch, context=args.context, learners=max(WORLD, 1))
        self.data = DataStream(dcfg, load_corpus(dcfg), RANK)
        self.amp = args.amp != "none" and self.device.type == "cuda"
        self.tokens = args.batch * args.context  # this rank's, per step
        self.learner = None
        self.call_times: list[float] = []

    def _train(self) -> None:
        torch = self.torch
        x, y = (t.to(self.device, non_blocking=True) for t in self.data.next())
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            loss = self.net(x, y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # a step's time is the whole step's

    def plain(self) -> tuple[float, float]:
        """(wall-clock, this thread's CPU) seconds of one step."""
        t, c = time.perf_counter(), time.thread_time()
        self._train()
        return time.perf_counter() - t, time.thread_time() - c

    def atoll(self) -> tuple[float, float]:
        t, c = time.perf_counter(), time.thread_time()
        self._train()
        t1 = time.perf_counter()
        self.learner.step(tokens=self.tokens)
        t2 = time.perf_counter()
        self.call_times.append(t2 - t1)
        return t2 - t, time.thread_time() - c

    def from_rank0(self, value):
        """Rank 0's `value`, on every rank (itself with one rank): what the ranks decide
        together (a step count, the counters reported) is decided once, so that they agree
        by construction and make the same collective calls."""
        if WORLD == 1:
            return value
        box = [value]
        self.torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def gpu_peak(self) -> int:
        cuda = self.torch.cuda
        return cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else 0


def _start_syncer(loop: Loop, args: argparse.Namespace, run_dir: Path):
    """Rank 0 saves the weights and starts the syncer from them; every rank gets (the syncer
    process on rank 0, else None; its address; the run's secret; how long it took to start)."""
    import atoll

    syncer, addr, start_s = None, "", 0.0
    secret = secrets.token_hex(16)
    if RANK == 0:
        atoll.save_init(loop.model, run_dir / "init.safetensors")
        t = time.perf_counter()
        sets = ["learners=1", "schedule=push", *args.syncer_set]
        syncer, addr = start_syncer(run_dir, RUN, secret, sets, run_dir / "init.safetensors",
                                    args.comm_cpus)  # fmt: skip
        start_s = time.perf_counter() - t
    if WORLD > 1:
        got = [addr, secret]
        loop.torch.distributed.broadcast_object_list(got, src=0)
        addr, secret = got
    return syncer, addr, secret, start_s


def measure(args: argparse.Namespace) -> dict:
    import atoll
    from atoll.core import codec

    size, loop = args.size, Loop(args)
    say(size, f"{loop.params / 1e6:.1f}M parameters, {loop.n_layer} layers, d_model "
        f"{loop.d_model}, {loop.device}, {WORLD} rank(s)")  # fmt: skip
    warm = [loop.plain()[0] for _ in range(args.warmup)]
    step_s = statistics.median(warm[1:] or warm)
    rss_plain, gpu_plain = peak_rss_bytes(), loop.gpu_peak()
    say(size, f"plain step {1e3 * step_s:.0f} ms, peak RSS {rss_plain / MB:.0f} MiB")
    steps = loop.from_rank0(max(args.steps, round(args.min_block_s / step_s)))
    t = time.perf_counter()
    for p in loop.model.parameters():
        codec.digest(p)
    digest_s = time.perf_counter() - t
    run_dir = Path(tempfile.mkdtemp(prefix="atoll-scale-"))
    syncer, addr, secret, syncer_start_s = _start_syncer(loop, args, run_dir)
    opts = atoll.LearnerOptions(learner_id="S0", run_id=RUN, secret=secret, comm="process",
                                connect_timeout_s=1800.0)  # fmt: skip
    join_s = join_bytes = None
    try:
        if WORLD == 1:  # the same weights as the syncer's: digests match, nothing downloaded
            t = time.perf_counter()
            loop.learner = atoll.Learner(loop.model, loop.opt, addr, opts)
            join_s, join_bytes = time.perf_counter() - t, talker_bytes(loop)[0]
            say(size, f"join (digests match) {join_s:.2f} s, {join_bytes} bytes down")
            loop.learner.close()
        loop.plain()  # the weights now differ from the syncer's: this join heals in full
        t = time.perf_counter()
        loop.learner = atoll.Learner(loop.model, loop.opt, addr, opts)
        heal_s, heal_bytes = time.perf_counter() - t, talker_bytes(loop)[0]
        say(size, f"join with a full heal {heal_s:.2f} s, {heal_bytes / MB:.1f} MiB down")
        proc = getattr(getattr(loop.learner, "port", None), "proc", None)
        child = proc.pid if proc is not None else None
        if child is not None and args.comm_cpus:
            pin(child, args.comm_cpus)
        for _ in range(2):
            loop.atoll()

        def progress(b: int, p: list, a: list) -> None:
            pm, am = statistics.median(x[0] for x in p), statistics.median(x[0] for x in a)
            pct = 100 * (am / pm - 1)
            say(size, f"pair {b + 1}/{args.repeats} ({steps} steps each): plain "
                f"{1e3 * pm:.1f} ms, atoll {1e3 * am:.1f} ms ({pct:+.2f}%)")  # fmt: skip

        others = [pid for pid in (child, syncer.pid if syncer else None) if pid]
        busy = {pid: cpu_seconds(pid) for pid in others}  # CPU time of the child, the syncer
        timed = alternate(args.repeats, steps, loop.plain, loop.atoll, progress)
        busy = {pid: cpu_seconds(pid) - before for pid, before in busy.items()}
        rss = peak_rss_bytes(), peak_rss_bytes(child) if child else 0
        rss_syncer = peak_rss_bytes(syncer.pid) if syncer else 0
        bytes_down, bytes_up = talker_bytes(loop)
        flat = flat_fragments(loop.learner)
        loop.learner.close()
    finally:
        if loop.learner is not None:
            loop.learner.close()
        if syncer is not None:
            stop_syncer(syncer)
        shutil.rmtree(run_dir, ignore_errors=True)

    def part(side: list, i: int) -> list[list[float]]:  # wall-clock (0) or CPU (1) times
        return [[x[i] for x in blk] for blk in side]

    o = overheads(part(timed[0], 0), part(timed[1], 0))
    cpu = overheads(part(timed[0], 1), part(timed[1], 1))
    say(size, f"overhead {100 * o['overhead_paired_median']:+.2f}% (of medians "
        f"{100 * o['overhead_of_medians']:+.2f}%; training thread CPU time "
        f"{100 * cpu['overhead_paired_median']:+.2f}%), peak RSS learner {rss[0] / MB:.0f} MiB "
        f"(plain {rss_plain / MB:.0f}), comm child {rss[1] / MB:.0f}, syncer "
        f"{rss_syncer / MB:.0f}")  # fmt: skip
    n_steps = args.repeats * steps
    return {
        "size": size, "params": loop.params, "n_layer": loop.n_layer, "d_model": loop.d_model,
        "n_head": loop.d_model // 64, "device": str(loop.device), "ranks": WORLD,
        "amp": "bf16" if loop.amp else "none", "tokens_per_step": loop.tokens * WORLD,
        "context": args.context, "steps_per_block": steps, **o, "thread_cpu": cpu,
        **throughput(loop, args, o),
        "median_learner_step_call_ms": 1e3 * statistics.median(loop.call_times),
        "cpu_ms_per_atoll_step": {
            "comm_child": 1e3 * busy.get(child, 0.0) / n_steps,
            "syncer": 1e3 * busy.get(syncer.pid if syncer else 0, 0.0) / n_steps},
        "digest_s": digest_s, "syncer_start_s": syncer_start_s,
        "join_s": join_s, "join_bytes_down": join_bytes,
        "heal_s": heal_s, "heal_bytes_down": heal_bytes,
        "peak_rss_plain_bytes": rss_plain, "peak_rss_learner_bytes": rss[0],
        "peak_rss_comm_child_bytes": rss[1], "peak_rss_syncer_bytes": rss_syncer,
        "gpu_peak_plain_bytes": gpu_plain, "gpu_peak_atoll_bytes": loop.gpu_peak(),
        "bytes_up": bytes_up, "bytes_down": bytes_down, "flat_fragments": flat,
        "plain_blocks": timed[0], "atoll_blocks": timed[1],
    }  # fmt: skip


def flat_fragments(learner) -> list[int] | None:
    """[fragments in flat buffers, fragments] of the talking rank's learner (the path a user
    gets lays every fragment of the built-in model out flat); None on the other ranks."""
    store = getattr(getattr(learner, "proto", None), "flat", None)
    local = getattr(store, "local", store)  # an island's store keeps a FlatFragments
    if local is None or not hasattr(local, "holds"):
        return None
    n = len(local.plan.fragments)
    return [sum(local.holds(p) for p in range(n)), n]


def talker_bytes(loop: Loop) -> tuple[int, int]:
    """(bytes down, bytes up) of the island's talking rank (rank 0's `Learner`; the other
    ranks' `IslandMember`s hold no connection), on every rank."""
    learner = loop.learner
    mine = (learner.bytes_down, learner.bytes_up) if RANK == 0 else None
    return loop.from_rank0(mine)


def throughput(loop: Loop, args: argparse.Namespace, o: dict) -> dict:
    """Tokens per second of the whole island, each side, and MFU against the GPU's dense
    bf16 peak (FLOPs per token: 6 x parameters + 12 x layers x d_model x context)."""
    tokens = loop.tokens * WORLD
    out = {f"tokens_per_s_{side}": tokens / (1e-3 * o[f"median_step_{side}_ms"])
           for side in ("plain", "atoll")}  # fmt: skip
    peak = args.peak_tflops
    if peak is None and loop.device.type == "cuda":
        name = loop.torch.cuda.get_device_name(loop.device)
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
        out["gpu"] = name
    if peak:
        flops = 6 * loop.params + 12 * loop.n_layer * loop.d_model * args.context
        for side in ("plain", "atoll"):
            out[f"mfu_{side}"] = out[f"tokens_per_s_{side}"] * flops / (1e12 * peak * WORLD)
        out["peak_tflops_per_gpu"] = peak
    return out


def cpus(spec: str) -> set[int]:
    """'0', '0-3' or '0,2' -> a set of CPU numbers; '' -> empty (leave as is)."""
    out: set[int] = set()
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=list(SIZES), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--amp", choices=("bf16", "none"), default="bf16", help="cuda only")
    ap.add_argument("--peak-tflops", type=float, help="per GPU, for MFU (default: known GPUs)")
    for name, default in (("steps", 10), ("repeats", 5), ("warmup", 3), ("batch", 4),
                          ("context", 128), ("threads", 1)):  # fmt: skip
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--min-block-s", type=float, default=2.0)
    ap.add_argument("--train-cpus", type=cpus, default=set())
    ap.add_argument("--comm-cpus", type=cpus, default=set())
    ap.add_argument("--syncer-set", action="append", default=[], help="KEY=VALUE for the syncer")
    args = ap.parse_args()
    if args.train_cpus:
        os.sched_setaffinity(0, args.train_cpus)  # before torch starts any thread
    import torch

    torch.set_num_threads(args.threads)
    result = measure(args)
    if RANK == 0:
        args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
