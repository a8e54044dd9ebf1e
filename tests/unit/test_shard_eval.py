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


def _names(run_dir, shard):
    d = part_dir(run_dir / f"shard-{shard}")
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_parts_no_evaluation_will_read_are_dropped(tmp_path):
    _part(tmp_path, 0, 9, {"a": torch.ones(1)}, 1, 1)  # an earlier run's, before the set starts
    log = EventLog(tmp_path / "events.jsonl")
    ev = SetEvaluation(tmp_path, 2, lambda p: 1.0, log)
    assert _names(tmp_path, 0) == []
    for k in (1, 2, 20):  # shard 1 was down: a point far behind the newest never completes
        _part(tmp_path, 0, k, {"a": torch.ones(1)}, k, k)
    assert ev.once() is None
    assert _names(tmp_path, 0) == ["point-20.safetensors"]  # 20 - 16 = 4: 1 and 2 dropped
    for k in (18, 19):  # one a little behind may still complete (a restarted shard's books lag)
        _part(tmp_path, 0, k, {"a": torch.ones(1)}, k, k)
    _part(tmp_path, 1, 18, {"b": torch.ones(1)}, 18, 18)
    assert ev.once().tokens == 18 and _names(tmp_path, 0) == ["point-19.safetensors",
                                                             "point-20.safetensors"]  # fmt: skip
    ev.failed = "an earlier evaluation raised"  # then nothing is kept at all
    _part(tmp_path, 1, 20, {"b": torch.ones(1)}, 20, 20)
    assert ev.once() is None and _names(tmp_path, 0) == _names(tmp_path, 1) == []
    log.close()


def test_a_part_that_cannot_be_removed_is_said_and_the_evaluations_go_on(
    tmp_path, capsys, monkeypatch
):
    import pathlib

    log = EventLog(tmp_path / "events.jsonl")
    ev = SetEvaluation(tmp_path, 1, lambda p: 2.0, log)
    _part(tmp_path, 0, 1, {"a": torch.ones(1)}, 1, 1)
    real = pathlib.Path.unlink

    def busy(self, missing_ok=False):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "unlink", busy)
    assert ev.once() is None  # the thread would have died of this before
    assert "evaluation parts: [Errno 13] Permission denied" in capsys.readouterr().err
    monkeypatch.setattr(pathlib.Path, "unlink", real)
    _part(tmp_path, 0, 2, {"a": torch.ones(1)}, 2, 2)
    assert ev.once().eval_loss == 2.0  # and the next point is evaluated
    log.close()
