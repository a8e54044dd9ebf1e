"""The virtual-time prediction of a soak: the same scenario, steps and speeds, and the live
run's step time, in the virtual-time driver (a tiny model: goodput depends on times).

    .venv/bin/python benchmarks/soak_predict.py SCENARIO.toml STEPS STEP_TIME_S
"""

import json
import sys
import time

from atoll.config import build
from atoll.sim.runner import run_one

scen, steps, st = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sets = [
    "learners=4", "speeds=1,1,1,1.4", "quorum=1", "grace=true", "schedule=pull",
    "n_layer=2", "d_model=16", "n_head=2", "eval_points=2", "batch=1", "context=8",
    "eval_batches=1", f"steps={steps}", f"step_time_s={st}", f"scenario={scen}",
    "method=decoupled",
]  # fmt: skip
scfg, _ = build(sets, None)
t = time.time()
r = run_one(scfg, "decoupled")
out = {"goodput": r.goodput, "wall_time_s": r.wall_time_s, "chaos": getattr(r, "chaos", None)}
print(json.dumps({**out, "cpu_s": time.time() - t}, default=str))
