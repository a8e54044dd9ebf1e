"""One atoll learner of the peer benchmark: the user's own model and loop (workload.py) wrapped
with `atoll.Learner`, as the README shows. The syncer was started with
`atoll syncer --init <this model's init.safetensors>`.

    python benchmarks/peer/atoll_learner.py --rank R --work JSON --syncer HOST:PORT --out DIR \
        --secret-file F [--slow 2.0]

It trains until the syncer says the run's token budget is spent (`learner.should_stop`); each
step's compute seconds go into its progress file, where the harness reads tokens over time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload as wl  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--syncer", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--run-id", default="peer")
    ap.add_argument("--slow", type=float, default=1.0)
    ap.add_argument("--comm", default=os.environ.get("PEER_ATOLL_COMM", "auto"))
    a = ap.parse_args()
    wl.setup_threads()
    import atoll

    w = wl.Work.from_json(a.work)
    model = wl.build_model(w)
    opt = wl.inner_optimizer(model, w)
    train, _ = wl.corpus()
    batches = wl.Batches(train, w, a.rank)
    prog = wl.Progress(a.out / f"progress-{a.rank}.jsonl")
    slow = wl.Straggler(a.slow)
    opts = atoll.LearnerOptions(
        learner_id=f"L{a.rank}",
        run_id=a.run_id,
        secret_file=a.secret_file,
        comm=a.comm,
        events=str(a.out / f"learner-{a.rank}.jsonl"),
    )
    learner = atoll.Learner(model, opt, a.syncer, opts)
    t0 = time.time()
    while not learner.should_stop:
        slow.start()
        for g in opt.param_groups:
            g["lr"] = wl.lr_at(prog.step, w)
        x, y = batches.at(prog.step)
        loss = wl.loss_of(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        slow.done()
        prog.record(x.numel(), float(loss.detach()), time.perf_counter() - slow.t0)
        learner.step(tokens=x.numel())
        if prog.step % 20 == 0:
            print(f"[atoll L{a.rank}] step {prog.step} loss {float(loss):.3f} "
                  f"{time.time() - t0:.0f}s", flush=True)  # fmt: skip
    learner.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
