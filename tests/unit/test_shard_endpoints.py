"""A shard set's /status.json (atoll.live.syncer.shard_endpoints.combine) from its shards' own:
what is summed, what comes from the home shard, the learners' worst heartbeat age, goodput
from the summed useful seconds, and a shard that stopped answering."""

from __future__ import annotations

import pytest

from atoll.live.syncer.shard_endpoints import _Shard, combine


def _status(shard: int, **kw) -> dict:
    s = {
        "run_id": "r1", "epoch": f"e{shard}", "shard": shard, "shards": 2, "rounds": 10,
        "versions": [0, 0, 0], "learners_live": 2, "learners_expected": 2, "tokens": 1000,
        "token_budget": 5000, "accepted": 20, "refused": 1, "bytes_in": 100, "bytes_out": 200,
        "useful_s": 4.0, "restarts": 0, "start": 1000.0, "quiet_after_s": 2.5,
        "first_join": 1000.0, "last_accepted": 1010.0,
        "learners": [], "recent_rounds": [], "marks": [], "goodput": 0.1,
    }  # fmt: skip
    return {**s, **kw}


def _shards(*statuses: dict | None, now: float = 1010.0) -> list[_Shard]:
    out = []
    for i, st in enumerate(statuses):
        sh = _Shard(i, 9001 + i, status=st)
        sh.up, sh.seen_at = st is not None, now if st is not None else 0.0
        out.append(sh)
    return out


def test_the_set_sums_the_shards_and_takes_the_budget_and_unknown_keys_from_the_home_shard():
    s0 = _status(0, versions=[3, 0, 5], tokens=1200, eval_losses=[[100, 4.1]])
    s0["learners"] = [{"id": "L0", "incarnation": "a", "age_s": 0.4, "tokens": 1200,
                       "bytes_in": 100, "bytes_out": 70, "merged": 3, "staleness": 0,
                       "steps": 40, "ranks": 2, "reconnects": 0}]  # fmt: skip
    s0["recent_rounds"] = [{"t": 1005.0, "fragment": 0, "participants": ["L0"]}]
    s1 = _status(1, versions=[0, 7, 0], tokens=900, rounds=6, accepted=12, useful_s=2.0)
    s1["learners"] = [
        {
            "id": "L0",
            "incarnation": "a",
            "age_s": 1.7,
            "tokens": 900,
            "bytes_in": 50,
            "bytes_out": 30,
            "merged": 2,
            "staleness": 1,
            "steps": 39,  # its beat reached this shard before the newest
            "ranks": 2,
            "reconnects": 1,
        },
        {"id": "L1", "incarnation": "b", "age_s": 0.2, "tokens": 800},
    ]
    s1["recent_rounds"] = [{"t": 1003.0, "fragment": 1, "participants": ["L1"]}]
    shards = _shards(s0, s1)
    out = combine(shards, {0: s0, 1: s1}, now=1010.0)
    assert out["rounds"] == 16 and out["accepted"] == 32 and out["refused"] == 2
    assert (out["bytes_in"], out["bytes_out"], out["useful_s"]) == (200, 400, 6.0)
    assert (out["tokens"], out["token_budget"], out["epoch"]) == (1200, 5000, "e0")  # home's
    assert out["eval_losses"] == [[100, 4.1]]  # a key of the home shard's passed through
    assert out["versions"] == [3, 7, 5]
    # useful seconds of both shards over 2 expected learners x 10 s since the home's start
    assert out["goodput"] == pytest.approx(6.0 / (2 * 10.0))
    rows = {r["id"]: r for r in out["learners"]}
    assert rows["L0"]["age_s"] == 1.7 and rows["L0"]["shards"] == [0, 1]  # the worst age
    # every shard's bytes and merges, the stalest newest merge
    assert (rows["L0"]["bytes_in"], rows["L0"]["merged"], rows["L0"]["staleness"]) == (150, 5, 1)
    # bytes down summed; steps, island size and reconnects as the most any shard saw
    assert rows["L0"]["bytes_out"] == 100
    assert (rows["L0"]["steps"], rows["L0"]["ranks"], rows["L0"]["reconnects"]) == (40, 2, 1)
    assert rows["L1"]["shards"] == [1] and out["learners_live"] == 2
    assert [r["fragment"] for r in out["recent_rounds"]] == [1, 0]  # by time
    assert [r["shard"] for r in out["recent_rounds"]] == [1, 0]
    assert [(r["shard"], r["up"], r["rounds"]) for r in out["shards"]] == [
        (0, True, 10),
        (1, True, 6),
    ]
    assert out["shard"] == "all"


def test_a_shard_that_stops_answering_is_down_with_its_last_figures_and_no_learners():
    s0, s1 = _status(0), _status(1, rounds=6)
    s1["learners"] = [{"id": "L1", "incarnation": "b", "age_s": 0.2, "tokens": 800}]
    shards = _shards(s0, s1)
    shards[1].up, shards[1].seen_at, shards[1].error = False, 1004.0, "connection refused"
    out = combine(shards, {0: s0}, now=1010.0)
    row = out["shards"][1]
    assert (row["up"], row["age_s"], row["rounds"]) == (False, 6.0, 6)
    assert "refused" in row["error"]
    assert out["rounds"] == 16  # its last figures stay in the sums: they do not step back
    assert out["learners"] == [] and out["learners_live"] == 0  # only shards answering now


def test_no_shard_ever_answered_gives_a_page_of_zeros_and_every_shard_down():
    out = combine(_shards(None, None), {}, now=1010.0)
    assert out["rounds"] == 0 and out["tokens"] == 0 and out["goodput"] == 0.0
    assert [r["up"] for r in out["shards"]] == [False, False]
    assert out["learners"] == [] and out["marks"] == []


def test_the_home_shard_never_answered_the_others_start_and_figures_serve():
    s1 = _status(1, first_join=1005.0, useful_s=5.0)
    out = combine(_shards(None, s1), {1: s1}, now=1010.0)
    assert out["rounds"] == 10 and out["epoch"] == "e1"
    assert out["goodput"] == pytest.approx(5.0 / (2 * 5.0))


def test_the_sets_window_is_the_earliest_join_to_the_latest_contribution_and_holds_while_idle():
    s0 = _status(0, finished=True, first_join=1002.0, last_accepted=1006.0, useful_s=3.0, evals=[])
    s1 = _status(1, finished=False, first_join=1000.0, last_accepted=1008.0, useful_s=5.0)
    evals = [{"t": 1007.0, "tokens": 4000, "rounds": 30, "loss": 3.25}]
    out = combine(_shards(s0, s1), {0: s0, 1: s1}, now=1050.0, evals=evals)
    assert out["goodput"] == pytest.approx(8.0 / (2 * 8.0)) and out["window_s"] == 8.0
    assert out["evals"] == evals  # the supervisor's, not the home shard's (none)
    s0["finished"] = False  # running or over, idle for 42 s: the same figure, no decay
    later = combine(_shards(s0, s1), {0: s0, 1: s1}, now=1500.0)
    assert later["goodput"] == out["goodput"] and later["evals"] == []
