"""A built-in learner's training step imports no torch._dynamo (and so no sympy): torch's
optimizers do on their first call, about 2 CPU seconds in every learner process
(model/adamw.py). In a fresh interpreter, since a test process may have imported it already."""

import subprocess
import sys

CODE = """
import sys
from atoll.config import SimConfig
from atoll.model.recipe import new_model
from atoll.model.train import new_inner_optimizer, train_step
import torch
cfg = SimConfig()
model = new_model(cfg)
opt = new_inner_optimizer(model, cfg)
x = torch.randint(0, 200, (2, cfg.context))
train_step(model, opt, (x, x), cfg.lr)
print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
"""


def test_a_built_in_training_step_imports_no_dynamo():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
