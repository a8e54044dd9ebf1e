"""What the live syncer keeps of each learner for its page (atoll.live.syncer.roster): steps
across incarnations, reconnects of one incarnation, bytes each way, merges, and the bound."""

from __future__ import annotations

from atoll.core.events import Accepted, Event, RoundClosed
from atoll.live.syncer import roster as roster_mod
from atoll.live.syncer.roster import Roster


def test_steps_add_up_across_incarnations_and_a_reopened_stream_is_a_reconnect():
    r = Roster()
    r.joined("L0", "a", ranks=0, live=())
    r.beat("L0", "a", 5)
    r.beat("L0", "a", 3)  # an older beat arriving late does not take steps back
    r.beat("L0", "old", 99)  # another incarnation's beat counts for nothing
    r.joined("L0", "a", ranks=2, live=())  # the same process's stream, reopened
    assert (r.rows["L0"].steps, r.rows["L0"].reconnects, r.rows["L0"].ranks) == (5, 1, 2)
    r.joined("L0", "b", ranks=2, live=())  # a restart: a new incarnation, not a reconnect
    r.beat("L0", "b", 4)
    row = r.rows["L0"].row()
    assert (row["steps"], row["reconnects"], row["joins"]) == (9, 1, 3)
    assert "incarnation" not in row and "steps_before" not in row
    assert r.total_steps() == 9


def test_bytes_each_way_merges_and_the_newest_update():
    r = Roster()
    r.joined("L0", "a", 1, ())
    r.sent("L0", 2, 7, 100)
    r.sent("L0", 0, 8, 50)
    r.sent("nobody", 0, 8, 50)  # a learner that never joined gets no row from a send
    r.observe(Event(1.0, "syncer", Accepted("L0", 0, 1, 30, 0.5)), ())
    closed = RoundClosed(0, 8, ["L0", "L1"], [1.0, 1.0], [2, 0], 0.0, 0.0, 60, 100)
    r.observe(Event(2.0, "syncer", closed), ())
    row = r.rows["L0"].row()
    assert (row["bytes_out"], row["last"], row["bytes_in"]) == (150, "0@8", 30)
    assert (row["merged"], row["staleness"]) == (1, 2)
    assert (r.rows["L1"].merged, r.rows["L1"].staleness) == (1, 0) and "nobody" not in r.rows


def test_past_the_bound_only_live_learners_are_kept(monkeypatch):
    monkeypatch.setattr(roster_mod, "MAX_ROWS", 3)
    r = Roster()
    for lid in ("A", "B", "C"):
        r.joined(lid, "x", 1, ())
    r.joined("D", "x", 1, live={"B"})
    assert set(r.rows) == {"B", "D"}
