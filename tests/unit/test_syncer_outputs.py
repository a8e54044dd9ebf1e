"""The syncer's typed outputs its drivers act on (no driver reads an event's kind to decide):
`Commit` before a round's updates, `PushAnswer` for every contribution, typed timer keys."""

import torch

from atoll.core import codec
from atoll.core.events import Event, RoundClosed
from atoll.core.messages import (
    Action,
    CloseRound,
    Commit,
    Contribution,
    PushAnswer,
    Refusal,
    Send,
    SetTimer,
)
from tests.helpers import setup


def _contrib(plan, lid, p, seq, base):
    payload = codec.encode(torch.full((plan.fragments[p].numel,), 0.01), "fp32")
    return Contribution(lid, p, seq, base, payload, 1, 10, 1.0, 1.0)


def test_a_merge_commits_before_any_update_goes_out():
    plan, syncer, _ = setup(quorum=1)
    out = syncer.on_contribution(1.0, _contrib(plan, "L0", 0, 1, 0))
    kinds = [type(o).__name__ for o in out]
    assert kinds == ["Event", "PushAnswer", "Commit", "Send", "Send", "Event"]
    commit = out[2]
    closed = out[-1].data
    assert isinstance(closed, RoundClosed)
    assert commit == Commit(closed.fragment, closed.version) == Commit(0, 1)
    assert all(isinstance(o, Send) and o.message.version == 1 for o in out[3:5])


def test_every_contribution_gets_one_answer():
    plan, syncer, _ = setup(quorum=2)
    ok = syncer.on_contribution(1.0, _contrib(plan, "L0", 0, 1, 0))
    assert [o for o in ok if isinstance(o, PushAnswer)] == [PushAnswer(True)]
    stale = syncer.on_contribution(1.0, _contrib(plan, "L1", 0, 1, 7))
    (answer,) = [o for o in stale if isinstance(o, PushAnswer)]
    assert not answer.accepted and answer.action is Action.HEAL
    assert answer.code == Refusal.STALE_BASE.value and answer.action == "heal"
    refused = [o.data for o in stale if isinstance(o, Event)]
    assert [(r.code, r.reason) for r in refused] == [(answer.code, answer.reason)]
    stranger = syncer.on_contribution(1.0, _contrib(plan, "X", 0, 1, 0))
    (answer,) = [o for o in stranger if isinstance(o, PushAnswer)]
    assert answer.action is Action.REJOIN and not any(isinstance(o, Commit) for o in stranger)


def test_a_close_timer_of_an_older_round_does_nothing():
    plan, syncer, _ = setup(quorum=1, grace=True, n=3)
    syncer.grace.to_quorum.value = syncer.grace.step.value = 1.0  # a grace window opens
    out = syncer.on_contribution(1.0, _contrib(plan, "L0", 0, 1, 0))
    (timer,) = [o for o in out if isinstance(o, SetTimer)]
    assert isinstance(timer.key, CloseRound) and timer.key == CloseRound(0, syncer.round_id[0])
    assert syncer.on_timer(timer.at, CloseRound(0, syncer.round_id[0] - 1)) == []
    closed = syncer.on_timer(timer.at, timer.key)
    assert Commit(0, 1) in closed
