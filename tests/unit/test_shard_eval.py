"""A shard set's evaluations (atoll.live.syncer.shard_eval): the supervisor evaluates the whole
model once every shard's part of a point is written, records it with the home shard's tokens and
every shard's rounds, drops that point's parts and older ones, waits on an incomplete point, and
stops evaluating (the set goes on) when the evaluation raises."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from atoll.eventlog import EventLog, load_events
from atoll.live.syncer.shard_eval import SetEvaluation, part_dir


def _part(run_dir, shard, point, tensors, tokens, rounds):
    d = part_dir(run_dir / f"shard-{shard}")
    d.mkdir(parents=True, exist_ok=True)
    meta = {"tokens": str(tokens), "rounds": str(rounds), "point": str(point)}
    save_file(tensors, str(d / f"point-{point}.safetensors"), meta)


def test_a_complete_point_is_evaluated_once_with_every_shards_part(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    seen = []

    def evaluate(params):
        seen.append(sorted(params))
        return float(params["a"].sum() + params["b"].sum())

    ev = SetEvaluation(tmp_path, 2, evaluate, log)
    _part(tmp_path, 0, 1, {"a": torch.ones(3)}, 100, 5)
    assert ev.once() is None  # shard 1's part not yet there
    _part(tmp_path, 1, 1, {"b": torch.full((2,), 2.0)}, 99, 7)
    _part(tmp_path, 0, 2, {"a": torch.zeros(3)}, 200, 9)  # a newer point, not complete
    e = ev.once()
    assert e is not None and e.eval_loss == 3.0 + 4.0 and seen == [["a", "b"]]
    assert (e.tokens, e.rounds) == (100, 12)  # the home shard's tokens, every shard's rounds
    assert ev.once() is None  # evaluated once
    assert sorted(p.name for p in (tmp_path / "shard-0" / "eval").iterdir()) == [
        "point-2.safetensors"
    ]
    _part(tmp_path, 1, 3, {"b": torch.zeros(2)}, 300, 11)
    _part(tmp_path, 0, 3, {"a": torch.zeros(3)}, 300, 10)
    assert ev.once().tokens == 300  # the newest complete point; point 2 is dropped with it
    assert not any(list((tmp_path / f"shard-{i}" / "eval").iterdir()) for i in (0, 1))
    log.close()
    got = [x.data.eval_loss for x in load_events(tmp_path / "events.jsonl")]
    assert got == [7.0, 0.0]


def test_a_failing_evaluation_ends_the_evaluations_only(tmp_path, capsys):
    log = EventLog(tmp_path / "events.jsonl")

    def broken(params):
        raise ValueError("no such layer")

    ev = SetEvaluation(tmp_path, 1, broken, log)
    _part(tmp_path, 0, 1, {"a": torch.ones(1)}, 1, 1)
    assert ev.once() is None and "no such layer" in (ev.failed or "")
    assert "no more live evaluations" in capsys.readouterr().err
    _part(tmp_path, 0, 2, {"a": torch.ones(1)}, 2, 2)
    assert ev.once() is None
    log.close()
