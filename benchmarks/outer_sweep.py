"""Which merge, outer optimizer and receipt mode work best in the virtual-time driver?

Runs each variant of Decoupled DiLoCo (M=4, K=1 + grace, int4) over several seeds on the same
token budget, beside data-parallel, and writes benchmarks/results/outer_sweep.json with the
median held-out loss of each. This is the measurement behind atoll's defaults.

    .venv/bin/python benchmarks/outer_sweep.py [--steps 300] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from atoll.config import SimConfig
from atoll.sim.runner import run_one

VARIANTS: dict[str, dict[str, object]] = {
    "data_parallel": {"method": "data_parallel"},
    "rda+nesterov(0.7,0.9)+overwrite": {
        "merge": "rda",
        "outer": "nesterov",
        "outer_lr": 0.7,
        "outer_momentum": 0.9,
        "receipt": "overwrite",
    },
    "rda+sgd(1)+overwrite": {
        "merge": "rda",
        "outer": "sgd",
        "outer_lr": 1.0,
        "receipt": "overwrite",
    },
    "mean+nesterov(0.7,0.5)+overwrite": {
        "merge": "mean",
        "outer": "nesterov",
        "outer_lr": 0.7,
        "outer_momentum": 0.5,
        "receipt": "overwrite",
    },
    "mean+sgd(1)+overwrite": {
        "merge": "mean",
        "outer": "sgd",
        "outer_lr": 1.0,
        "receipt": "overwrite",
    },
    "mean+sgd(1)+carry": {"merge": "mean", "outer": "sgd", "outer_lr": 1.0, "receipt": "carry"},
    "rda+sgd(1)+overwrite, int4 down": {
        "merge": "rda",
        "outer": "sgd",
        "outer_lr": 1.0,
        "receipt": "overwrite",
        "down_codec": "int4",
    },
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/outer_sweep.json"))
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for name, kw in VARIANTS.items():
        losses = []
        for seed in seeds:
            t0 = time.time()
            r = run_one(SimConfig(steps=args.steps, seed=seed, **kw), name)
            losses.append(r.eval_loss)
            print(
                f"{name:36s} seed {seed}: loss {r.eval_loss:.4f} ({time.time() - t0:.0f} s)",
                flush=True,
            )
        rows.append(
            {
                "variant": name,
                "settings": kw,
                "losses": losses,
                "median_loss": statistics.median(losses),
            }
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"steps": args.steps, "seeds": seeds, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
