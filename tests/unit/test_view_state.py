"""The live view's figures (atoll.live.view.RunState) from typed events and from what a syncer
hears of its learners: island sizes, held-out losses, tokens/s from beats, quiet learners, and
the training window ending at the last contribution once the run is over."""

from __future__ import annotations

from atoll.core.events import Accepted, Evaluated, Event, Joined, Reconnected, Training
from atoll.live.view import RunState, render


def test_events_give_ranks_evaluations_and_the_window():
    s = RunState(learners=2, token_budget=1000)
    s.feed(Event(10.0, "L0", Training("a", 0.5, island=4)))
    s.feed(Event(10.0, "L1", Training("b", 0.5)))
    assert (s.row("L0").ranks, s.row("L1").ranks) == (4, 1)
    s.feed(Event(11.0, "L1", Reconnected(False, "e1")))
    assert (s.row("L1").reconnects, s.row("L0").reconnects) == (1, 0)
    assert s.eval_text() == "-"
    s.feed(Event(12.0, "syncer", Evaluated(tokens=250, rounds=3, eval_loss=3.25, eval_s=0.1)))
    s.feed(Event(14.0, "syncer", Evaluated(tokens=500, rounds=6, eval_loss=2.5, eval_s=0.1)))
    assert s.evals == [(250, 3.25), (500, 2.5)]
    assert s.eval_text() == "2.5000 at 500 tokens" and "eval 2.5000 at 500" in s.line(15.0)
    assert s.goodput() is None  # no contribution yet
    s.feed(Event(9.0, "syncer", Joined("L0")))
    s.feed(Event(15.0, "syncer", Accepted("L0", 0, 1, 4, 6.0)))
    assert s.last_accepted == 15.0
    assert s.goodput() == 6.0 / (2 * 6.0)  # the first join to the latest contribution
    assert s.goodput(100.0) == s.goodput()  # idle or over: the figure holds


def test_what_a_syncer_hears_sets_tokens_rates_and_quiet_learners():
    s = RunState(learners=2)
    s.heard([{"id": "L0", "incarnation": "a", "tokens": 100, "age_s": 0.2}], 100.0, 1.5)
    assert s.started == 100.0 and s.row("L0").state == "training"
    s.heard(
        [
            {"id": "L0", "incarnation": "a", "tokens": 300, "age_s": 2.0},
            {"id": "L1", "incarnation": "b", "tokens": 50, "age_s": 0.1},
        ],
        102.0,
        1.5,
    )
    assert s.row("L0").tokens_per_s == 100.0 and s.row("L0").state == "quiet"
    assert s.total_tokens() == 350
    s.heard([], 103.0, 1.5, tokens=420)  # the syncer's books: the run's tokens from then on
    assert s.total_tokens() == 420
    text = str(render(s, 103.0, "atoll syncer").renderables[0].title)
    assert text == "atoll syncer"


def test_the_view_starts_at_the_first_join_until_a_training_step_is_seen():
    s = RunState(learners=2)
    s.feed(Event(5.0, "syncer", Joined("L0")))
    assert s.started == 5.0  # a syncer whose learners log elsewhere: its view starts here
    s.feed(Event(7.0, "L0", Training("a", 0.1)))
    s.feed(Event(6.5, "L1", Training("b", 0.1)))
    assert s.started == 6.5  # the first training step, as the run's summary counts it


def test_a_view_that_fails_says_so_once_and_the_run_goes_on(tmp_path, capsys):
    import io

    from atoll.live.view import RunView

    calls = []

    def hear(state, now):
        calls.append(now)
        raise OSError("the log's disk went away")

    view = RunView(tmp_path / "events.jsonl", RunState(2), out=io.StringIO(), hear=hear)
    view.start()
    view.tick(100.0)
    view.tick(200.0)
    view.stop()
    assert len(calls) == 1  # the view ended at its first failure; nothing raised
    assert capsys.readouterr().err.count("the live view stopped") == 1


def test_a_syncers_learner_figures_fill_the_rows_until_the_learner_reports_its_own():
    from atoll.core.events import Step

    s = RunState(learners=2, dp_bytes_per_step=1000.0)  # a custom model: bytes per step
    row = {"id": "L0", "incarnation": "a", "tokens": 640, "age_s": 0.1, "steps": 10, "ranks": 4,
           "reconnects": 2, "bytes_in": 5_000, "bytes_out": 7_000, "last": "3@9"}  # fmt: skip
    s.heard([row], 100.0, 1.5)
    r = s.row("L0")
    assert (r.step, r.ranks, r.reconnects, r.up, r.down, r.last) == (10, 4, 2, 5000, 7000, "3@9")
    assert s.bytes_ratio() == (12_000, 10 * 1000.0)
    assert "data-parallel 0 MB" in s.line(101.0)  # 10 kB: shown, not "-"
    # its own step reports, once in the log, replace what the syncer said of it
    s.feed(Event(101.0, "L0", Step("a", 12, 768, 0.1, 0, None, wire_up=9_000, wire_down=1_000)))
    s.heard([{**row, "steps": 11}], 102.0, 1.5)
    assert (s.row("L0").step, s.row("L0").up) == (12, 9_000)
    assert s.bytes_ratio() == (10_000, 12 * 1000.0)


def test_without_a_data_parallel_figure_the_line_says_so():
    s = RunState(learners=2)
    s.heard([{"id": "L0", "incarnation": "a", "tokens": 64, "age_s": 0.1, "steps": 1}], 1.0, 1.5)
    assert "(data-parallel -)" in s.line(2.0)
