"""The run-level rules (atoll.core.budget): the token budget, the syncer's side and a learner's,
and the synchronized start."""

from __future__ import annotations

import pytest

from atoll.core.budget import BeatAnswer, BudgetShare, StartBarrier, TokenBudget


def test_no_budget_never_stops_and_says_so():
    b = TokenBudget(0)
    assert not b.stop_requested(10**12)
    assert b.answer(10**12, 3) == BeatAnswer(stop=False, budget=False, remaining=0, live=3)


@pytest.mark.parametrize(
    ("tokens", "stop", "remaining"), [(0, False, 1000), (999, False, 1), (1000, True, 0)]
)
def test_budget_stops_once_reached_and_counts_what_remains(tokens, stop, remaining):
    b = TokenBudget(1000)
    assert b.stop_requested(tokens) is stop
    assert b.answer(tokens, 2) == BeatAnswer(stop, True, remaining, 2)


def test_budget_overshoot_leaves_nothing_and_live_is_at_least_one():
    a = TokenBudget(1000).answer(1500, 0)
    assert a == BeatAnswer(stop=True, budget=True, remaining=0, live=1)


def test_start_barrier_sets_the_start_once_when_the_expected_learners_are_in():
    s = StartBarrier(3)
    assert s.joined(10.0, 1) is None
    assert s.joined(11.0, 2) is None
    assert s.joined(12.0, 3) == pytest.approx(12.5)
    # later joins (a fourth learner, a rejoin after one was lost) keep the start time
    assert s.joined(20.0, 4) == pytest.approx(12.5)
    assert s.joined(21.0, 2) == pytest.approx(12.5)


def test_start_barrier_off_and_restored():
    assert StartBarrier(0).joined(5.0, 100) is None
    assert StartBarrier(2, delay_s=1.0).joined(5.0, 2) == pytest.approx(6.0)
    # a restarted syncer keeps the start time an earlier process set
    assert StartBarrier(2, start_at=3.0).joined(50.0, 2) == pytest.approx(3.0)


def test_a_learner_asks_once_at_its_share_of_what_was_left_and_stops_only_when_told():
    share = BudgetShare()
    assert not share.ask(10**9) and not share.spent(10**9)  # no answer yet: no budget known
    share.answer(tokens=1000, remaining=300, live=3)  # 100 tokens are this learner's
    assert not share.ask(1099) and share.ask(1100)
    assert not share.ask(1200) and not share.spent(1200)  # asked once; it trains on
    share.answer(tokens=1200, remaining=50, live=2)  # still not told to stop: asks again
    assert not share.ask(1224) and share.ask(1225) and not share.spent(1300)
    share.stop()
    assert share.spent(1300) and not share.ask(1400)


def test_the_only_live_learner_stops_once_it_has_trained_what_was_left():
    """Alone, its share is the whole rest: the run cannot fall short, and it ends exactly."""
    share = BudgetShare()
    share.answer(tokens=1000, remaining=300, live=1)
    assert not share.spent(1299) and share.spent(1300) and not share.ask(1300)
    share.answer(tokens=1300, remaining=0, live=0)  # nothing left (no session counted as 1)
    assert share.spent(1300)


def test_answers_of_different_ages_do_not_end_a_run_short_of_its_budget():
    """L0 is answered before anyone trained (500 of 1,000 are its), L1 after L0 trained 400
    (300 are its). Stopping on their shares, as learners did, they ended at 500 + 300: 800 of
    1,000. Now each asks when it has trained its share and goes on until the syncer says stop."""
    budget = TokenBudget(1000)
    l0, l1 = BudgetShare(), BudgetShare()
    a = budget.answer(0, 2)
    l0.answer(0, a.remaining, a.live)
    a = budget.answer(400, 2)
    l1.answer(0, a.remaining, a.live)
    assert l0.share == (0, 500.0) and l1.share == (0, 300.0)
    assert l0.ask(500) and l1.ask(300) and not l0.spent(500) and not l1.spent(300)
    a = budget.answer(800, 2)  # the syncer counts both: 200 left, 100 each
    assert not a.stop
    l0.answer(500, a.remaining, a.live)
    l1.answer(300, a.remaining, a.live)
    assert l0.ask(600) and l1.ask(400)
    assert budget.answer(1000, 2).stop  # now the syncer says stop: 1,000 trained


def test_a_learner_stops_when_the_syncer_says_so_and_its_state_round_trips():
    share = BudgetShare()
    share.answer(tokens=10, remaining=50, live=2)
    again = BudgetShare()
    again.load_state_dict(share.state_dict())
    assert again == share and not again.ask(34) and again.ask(35) and not again.spent(35)
    share.stop()
    assert share.spent(0)
    again.load_state_dict(share.state_dict())
    assert again.stopped
