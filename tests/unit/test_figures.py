"""The run's figures (atoll.metrics.Figures), the one fold every surface reads: tokens as the
most each incarnation reported (the syncer's count winning), goodput over the first join to
the latest contribution and holding while idle, a shard set's sums; and the status page's
chart history (thinned, never losing the run's start or end) and tokens/s."""

from __future__ import annotations

import pytest

from atoll.core.events import Accepted, Evaluated, Event, Joined, RoundClosed, Step
from atoll.live.syncer.chart_history import (
    MAX_POINTS,
    ChartHistory,
    TokenRates,
    combine_history,
    replayed,
)
from atoll.metrics import Figures, combine_figures, figures


def _stream() -> list[Event]:
    rc = RoundClosed(0, 1, ["L0", "L1"], [1, 1], [0, 0], 0.0, 0.0, 30, 20)
    return [
        Event(10.0, "syncer", Joined("L0")),
        Event(11.0, "syncer", Joined("L1")),
        Event(12.0, "L0", Step("a", 1, 100, 0.5, 0, None)),
        Event(13.0, "L0", Step("a", 2, 200, 0.5, 0, None)),
        Event(13.5, "L1", Step("b", 1, 150, 0.5, 0, None)),
        Event(14.0, "syncer", Accepted("L0", 0, 1, 10, 3.0)),
        Event(16.0, "syncer", Accepted("L1", 0, 1, 20, 5.0)),
        Event(16.0, "syncer", rc),
    ]


def test_the_fold_gives_tokens_rounds_bytes_and_goodput_over_the_training_window():
    f = figures(_stream(), learners=2)
    assert (f.total_tokens(), f.rounds, f.accepted, f.received_bytes) == (350, 1, 2, 30)
    assert f.window_s() == 6.0  # the first join (10) to the latest contribution (16)
    assert f.goodput() == pytest.approx(8.0 / (2 * 6.0))
    f.heard_tokens = 400  # the syncer's books: the budget's count wins
    assert f.as_dict()["tokens"] == 400 and f.as_dict()["goodput"] == f.goodput()
    f.feed(Event(99.0, "syncer", Joined("L2")))  # later joins and idle time move nothing
    assert f.goodput() == pytest.approx(8.0 / (2 * 6.0))
    assert Figures(2).goodput() == 0.0 and Figures(2).window_s() is None


def test_a_shard_sets_figures_sum_its_shards_over_the_earliest_join_to_the_latest_contribution():
    a = Figures(rounds=3, accepted=4, received_bytes=40, useful_s=6.0, start=10.0,
                last_accepted=20.0, heard_tokens=900)  # fmt: skip
    b = Figures(rounds=2, accepted=3, received_bytes=30, useful_s=4.0, start=9.0,
                last_accepted=25.0, heard_tokens=850)  # fmt: skip
    s = combine_figures([a, b], learners=2)
    assert (s.rounds, s.accepted, s.received_bytes, s.useful_s) == (5, 7, 70, 10.0)
    assert (s.start, s.last_accepted, s.total_tokens()) == (9.0, 25.0, 900)  # home's tokens
    assert s.goodput() == pytest.approx(10.0 / (2 * 16.0))
    assert combine_figures([], 2).goodput() == 0.0


def test_the_chart_history_is_thinned_keeping_the_runs_start_and_end():
    h = ChartHistory()
    for i in range(1, 3 * MAX_POINTS):
        h.add(float(i), Figures(rounds=i, useful_s=float(i), start=0.0, last_accepted=float(i)))
    pts = h.series()
    assert len(pts) <= MAX_POINTS and pts[-1]["rounds"] == 3 * MAX_POINTS - 1
    assert pts[0]["rounds"] <= 8 and [p["t"] for p in pts] == sorted(p["t"] for p in pts)


def test_a_sets_history_sums_its_shards_latest_points():
    s0 = [{"t": 1.0, "tokens": 10, "rounds": 1, "useful_s": 1.0},
          {"t": 3.0, "tokens": 30, "rounds": 2, "useful_s": 3.0}]  # fmt: skip
    s1 = [{"t": 2.0, "tokens": 0, "rounds": 1, "useful_s": 2.0}]
    pts = combine_history([s0, s1], start=0.0, learners=1)
    assert [(p["t"], p["rounds"], p["tokens"], p["useful_s"]) for p in pts] == [
        (1.0, 1, 10, 1.0), (2.0, 2, 10, 3.0), (3.0, 3, 30, 5.0)]  # fmt: skip
    assert pts[-1]["goodput"] == pytest.approx(1.0)  # 5 s of work over 1 x 3 s, at most 1


def test_tokens_per_second_over_the_reports_of_the_last_seconds():
    r = TokenRates()
    assert r.rate("L0/a", 100.0, 0) == 0.0
    assert r.rate("L0/a", 101.0, 500) == 500.0
    assert r.rate("L0/a", 101.5, 500) == 500.0  # no new report: the same rate, not 0
    assert r.rate("L0/a", 103.0, 2000) == pytest.approx(2000 / 3)
    r.rate("L0/a", 130.0, 5000)  # a gap: from the last report before it
    assert r.rate("L0/a", 131.0, 6000) == pytest.approx(4000 / 28)
    assert r.rate("L0/a", 142.0, 8000) == pytest.approx(2000 / 11)  # the gap fell out
    r.keep(set())
    assert r.seen == {}


def test_a_restarted_syncer_replays_its_charts_from_the_stream():
    events = _stream()
    pts = replayed(events, learners=2).series()
    assert pts == [{"t": 16.0, "tokens": 350, "rounds": 1,
                    "goodput": pytest.approx(8.0 / 12.0), "useful_s": 8.0}]  # fmt: skip
    # learners logging elsewhere: the tokens of the latest evaluation
    alone = [e for e in events if e.kind != "step"]
    alone.insert(
        2, Event(13.9, "syncer", Evaluated(tokens=300, rounds=0, eval_loss=3.0, eval_s=0.1))
    )
    assert replayed(alone, learners=2).series()[0]["tokens"] == 300
