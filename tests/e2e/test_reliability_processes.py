"""A reliability defect of issue 9 that needs a real process: the learner's communication
process dies (against the live syncer service in this process)."""

from __future__ import annotations

import time

import pytest
import torch

from atoll.eventlog import read_events
from tests.helpers import CFG, RUN, SECRET

pytestmark = pytest.mark.slow


# -- issue 9, defect 10: the learner's communication process killed --------------------------------
def test_a_learner_whose_communication_process_dies_stops_loudly(live):
    """Before: it logged `comm_fatal` and trained offline for the rest of the run, alive,
    so its supervisor never restarted it. Now `step()` raises CommError (the process exits
    non-zero and is restarted; it then heals)."""
    from atoll.errors import CommError
    from atoll.live.learner import Learner, LearnerOptions
    from atoll.model.recipe import new_model

    service, _, _, tmp_path = live
    model = new_model(CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    addr = f"127.0.0.1:{service.port}"
    events = tmp_path / "events.jsonl"
    opts = LearnerOptions(learner_id="L0", run_id=RUN, secret=SECRET, comm="process",
                          events=str(events))  # fmt: skip
    learner = Learner(model, opt, addr, opts)
    learner.step(tokens=16)
    learner.port.proc.kill()
    learner.port.proc.wait()
    with pytest.raises(CommError):
        for _ in range(200):
            learner.step(tokens=16)
            time.sleep(0.01)
    learner.close()
    assert any(e["kind"] == "comm_fatal" for e in read_events(events))
