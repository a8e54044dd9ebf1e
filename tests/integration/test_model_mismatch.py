"""A learner whose model is not the syncer's (other parameter names, or other shapes) stops
with one line before it trains, leaves nothing running, and the syncer serves the next learner
as if it had never come (the live syncer in this process, the `live` fixture)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from atoll.config import SimConfig
from atoll.errors import ConfigError
from atoll.live.client import status
from atoll.live.learner import Learner, LearnerOptions
from atoll.model.recipe import new_model
from tests.helpers import CFG, RUN, SECRET


def _learner(model, port, learner_id):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opts = LearnerOptions(learner_id=learner_id, run_id=RUN, secret=SECRET, comm="thread",
                          connect_timeout_s=15)  # fmt: skip
    return Learner(model, opt, f"127.0.0.1:{port}", opts)


def _comm_threads():
    return [t for t in threading.enumerate() if t.name.startswith("atoll-")]


def _wait(cond, what, timeout=10.0):
    until = time.time() + timeout
    while not cond():
        assert time.time() < until, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("model", "says"),
    [
        (
            torch.nn.Linear(4, 4),
            "missing 17 of the syncer's (blocks.0.fc.bias, blocks.0.fc.weight, "
            "blocks.0.fc_out.bias, "
            "... 14 more); 2 the syncer lacks (bias, weight)",
        ),
        (
            new_model(SimConfig(n_layer=1, d_model=16, n_head=2, context=8)),
            "blocks.0.fc.bias has shape (64,), not (32,); ",
        ),
    ],
    ids=["names", "shapes"],
)
def test_a_learner_with_another_model_is_refused_and_the_syncer_serves_on(live, model, says):
    service, stub, died, run_dir = live
    port = service.port
    with pytest.raises(ConfigError) as err:
        _learner(model, port, "WRONG")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("model=") and says in msg, msg
    assert "the syncer's 17 parameters by name and shape" in msg
    assert not _comm_threads()  # its communication side was closed before it raised
    _wait(lambda: "WRONG" not in service.runtime.sessions, "the refused learner's session to end")
    # the syncer goes on: a learner with its model heals, trains, is merged and finishes
    model = new_model(CFG)
    learner = _learner(model, port, "RIGHT")
    x = torch.randint(0, 256, (CFG.batch, CFG.context))
    for _ in range(3 * CFG.H):
        loss = model(x, x)
        loss.backward()
        learner.optimizer.step()
        learner.optimizer.zero_grad()
        learner.step(tokens=x.numel())
        time.sleep(0.01)
    learner.finish(timeout=10)
    st = status(f"127.0.0.1:{port}", RUN, SECRET)
    assert st.rounds >= CFG.P and min(st.versions) >= 1 and learner.refused == 0
    assert not died
