"""Islands' settings and the checks made before any rank joins anything (no process group is
made here: the ranks themselves are tests/e2e/test_islands.py)."""

from __future__ import annotations

import pytest

from atoll.cli import main
from atoll.config import LiveConfig
from atoll.errors import ConfigError
from atoll.live.learner.island import island_group


def test_island_sizes_are_one_number_or_one_per_learner():
    assert LiveConfig().island_sizes(3) == [1, 1, 1]
    assert LiveConfig(island_size="2").island_sizes(2) == [2, 2]
    assert LiveConfig(island_size="1,2").island_sizes(2) == [1, 2]
    for bad in ("0", "1.5", "1,2,3", "x"):
        with pytest.raises(ConfigError, match="island_size"):
            LiveConfig(island_size=bad).island_sizes(2)


def test_a_process_under_torchrun_without_a_process_group_is_refused(monkeypatch):
    """Ranks that each made a Learner with no group would each train alone as one learner id:
    refused, naming WORLD_SIZE and what is expected."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="WORLD_SIZE='2' is not allowed: torch.distributed"):
        island_group(None)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert island_group(None) is None  # one process: a plain Learner
    monkeypatch.delenv("WORLD_SIZE")
    assert island_group(None) is None


def test_a_batch_that_the_island_cannot_split_stops_before_anything_starts(tmp_path, capsys):
    rc = main(["run", "--out", str(tmp_path / "r"), "--set", "island_size=1,3",
               "--set", "learners=2", "--set", "batch=16"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "batch=16 is not allowed: a multiple of island_size [1, 3]" in err[0]
    log = tmp_path / "r" / "events.jsonl"
    assert not log.exists() or "started" not in log.read_text()  # no process was started
