"""When a run with a token budget is over (core/budget.py `RunEnd`, asked through
`SyncerProtocol.run_over` and said by its `RunOver` event): the budget spent and every learner
gone since, or the window after the budget (`after_s` + the pull's answer window) passed."""

from __future__ import annotations

from atoll.core.budget import BeatAnswer, RunEnd, TokenBudget
from atoll.core.events import Event, RunOver
from atoll.core.messages import Progress, RunDeadline, SetTimer
from tests.helpers import setup

AFTER_S = 3.0  # the live syncer's lost_after_s


def _syncer(budget: int = 1000, **kw):
    plan, syncer, _ = setup(n=2, **kw)  # L0 and L1 joined at 0.0
    syncer.end = RunEnd(TokenBudget(budget), AFTER_S)
    return syncer


def _over(outputs) -> list[RunOver]:
    return [o.data for o in outputs if isinstance(o, Event) and isinstance(o.data, RunOver)]


def test_no_budget_is_never_over():
    s = _syncer(budget=0)
    assert s.on_tokens(1.0, 10**12) == []
    out = s.on_lost(2.0, "L0") + s.on_lost(3.0, "L1")
    assert not _over(out) and not s.run_over(10**9)


def test_budget_spent_and_every_learner_flushed_is_over_when_the_last_leaves():
    s = _syncer()
    assert s.on_tokens(10.0, 999) == [] and not s.run_over(10.0)
    # spent: the window's timer, after_s + the answer window (no step measured yet: 1 s)
    assert s.on_tokens(11.0, 1000) == [SetTimer(11.0 + AFTER_S + 1.0, RunDeadline())]
    assert s.on_tokens(11.5, 2000) == []  # once
    assert not s.run_over(11.5)
    assert not _over(s.on_lost(12.0, "L0", "stream ended")) and not s.run_over(12.0)
    (over,) = _over(s.on_lost(13.0, "L1", "stream ended"))
    assert over == RunOver("flushed", 2.0, None)
    assert s.run_over(13.0)
    assert s.on_timer(15.0, RunDeadline()) == []  # said once


def test_a_silent_learner_holds_the_run_until_the_window_after_the_budget_only():
    s = _syncer()
    s.on_tokens(11.0, 1000)
    s.on_lost(12.0, "L0")
    assert not s.run_over(14.99)
    (over,) = _over(s.on_timer(15.0, RunDeadline()))
    assert over == RunOver("window", 4.0, ["L1"])
    assert s.run_over(15.0)


def test_a_learner_that_joins_after_the_budget_is_waited_for_within_the_same_window():
    s = _syncer()
    s.on_tokens(11.0, 1000)
    s.on_lost(12.0, "L0")
    s.on_join(12.5, "L2")  # joins after the budget: it hears the stop and flushes too
    assert not _over(s.on_lost(13.0, "L1")) and not s.run_over(13.0)
    (over,) = _over(s.on_lost(13.5, "L2"))
    assert over.reason == "flushed"
    # one that joins and never leaves does not move the window's end
    s = _syncer()
    s.on_tokens(11.0, 1000)
    s.on_join(14.0, "L2")
    assert s.run_over(15.0) and _over(s.on_timer(15.0, RunDeadline()))[0].left == ["L0", "L1", "L2"]


def test_a_budget_spent_with_nobody_left_is_over_at_the_windows_end():
    """A syncer restored after the budget was spent: learners may still come back to flush."""
    s = _syncer()
    s.on_lost(1.0, "L0")
    s.on_lost(1.0, "L1")  # both gone before the budget was counted as spent
    assert not _over(s.on_tokens(2.0, 1000)) and not s.run_over(5.99)
    assert _over(s.on_timer(6.0, RunDeadline()))[0] == RunOver("window", 4.0, [])


def test_the_window_follows_the_measured_step_time():
    s = _syncer(schedule="pull", grace=True, tau=1)
    s.on_progress(1.0, Progress("L0", 1, 2.0, 1.0, 2.0))
    s.on_progress(1.0, Progress("L1", 1, 2.0, 1.0, 2.0))
    (timer, *_) = s.on_tokens(10.0, 1000)
    # the answer window: the slowest listening learner's step (2 s), no upload measured yet
    assert timer == SetTimer(10.0 + AFTER_S + 2.0, RunDeadline())


def test_rejoins_as_the_syncer_saw_them_count_each_new_process_once():
    """syncer_final.json's and a hand-started run's summary's rejoins (atoll.metrics): a
    learner back with a new incarnation, from its loss to its join; the same join and loss
    logged by two shards count once; a reconnect of the same process is no rejoin."""
    from atoll.core.events import Joined, Lost
    from atoll.metrics import syncer_rejoins

    def ev(t, rec):
        return Event(t, "syncer", rec)

    events = [
        ev(0.0, Joined("L0", "a")), ev(0.0, Joined("L0", "a")),  # two shards
        ev(1.0, Joined("L1", "x")),
        ev(5.0, Lost("L0", "stream ended")), ev(5.2, Lost("L0", "stream ended")),
        ev(7.5, Joined("L0", "b")), ev(7.6, Joined("L0", "b")),  # back 2.5 s after its loss
        ev(8.0, Lost("L1", "silent")), ev(9.0, Joined("L1", "x")),  # the same process again
    ]  # fmt: skip
    assert syncer_rejoins(events) == [2.5]
    assert syncer_rejoins(events[:3]) == []


def test_a_heartbeat_gets_the_budgets_answer_from_the_protocol():
    """`on_beat`: the live syncer's heartbeats are counted by the protocol (the same rule as
    `on_tokens`), which answers each with what is left of the budget, then stop."""
    s = _syncer()
    answer, out = s.on_beat(10.0, 400, 2)
    assert out == [] and answer == BeatAnswer(stop=False, budget=True, remaining=600, live=2)
    answer, out = s.on_beat(11.0, 1000, 2)
    assert answer.stop and answer.remaining == 0 and out == [
        SetTimer(11.0 + AFTER_S + 1.0, RunDeadline())
    ]
    assert s.on_beat(11.5, 1200, 1) == (BeatAnswer(True, True, 0, 1), [])  # spent once
    assert _syncer(budget=0).on_beat(1.0, 10**12, 2)[0] == BeatAnswer(False, False, 0, 2)
