"""The end of a learner's run, for `Learner.finish`: the final flush, a bounded wait for it to be
merged (longer while the syncer is away), and the final heartbeat that reports the counters.

The functions take the `Learner` and use its step-boundary calls (`_boundary`, `_handle`,
`_drain`, `_flush`, `_outputs`); they decide nothing the protocol does not (it says what the final
flush sends and which answered fragments apply)."""

from __future__ import annotations

import time
from typing import Any

from atoll.core.events import FinalBeatLost
from atoll.core.learner import LearnerProtocol
from atoll.live.comm.messages import BeatDone, BeatOnce, Finishing


def final_flush(learner: Any, proto: LearnerProtocol, timeout: float, away_s: float) -> None:
    """Send every fragment's remaining work once and wait, at most `timeout` seconds once
    connected, until every send is answered; a syncer that is away is waited for `away_s`."""
    learner._drain()
    learner._boundary(proto.finish(time.time()))
    learner.port.send(Finishing())  # report the send queue after every send from now
    start = time.time()
    until = start + timeout
    while time.time() < until:
        if not learner.connected:  # away: the clock starts again once it is back
            if time.time() > start + away_s:
                break
            until = time.time() + timeout
        item = learner.port.get(0.02)
        if item is not None:
            learner._handle(item)
            learner._drain()
        if learner.connected and not learner._queued() and proto.all_answered():
            break
    learner._drain()
    learner._outputs(proto.apply_due(time.time()))
    learner._flush()


def beat_once(learner: Any, timeout: float) -> None:
    """Report the final counters synchronously; counters the syncer never counted are
    reported (`final_beat_lost`): the run's books miss those steps."""
    learner._flush()
    learner.port.send(BeatOnce())
    until, done = time.time() + timeout, None
    while done is None and time.time() < until:
        item = learner.port.get(max(until - time.time(), 0.001))
        if isinstance(item, BeatDone):
            done = item
        elif item is not None and learner.proto is not None:
            learner._handle(item)
    if done is None or not done.counted:
        learner.events.record(learner.id, FinalBeatLost(learner.tokens_done))
