"""A flood of idle connections without the secret against a real syncer serving a real
learner (benchmarks/flood.py): the syncer stays reachable to callers with the secret and the
learner's rounds keep closing. Each test stays under ~20 s."""

import os
import resource
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import flood  # noqa: E402  (benchmarks/flood.py)

from atoll.live.syncer.limits import HANDSHAKE_S  # noqa: E402

pytestmark = pytest.mark.slow


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_flood_over_the_default_descriptor_limit_does_not_blind_the_syncer():
    """The syncer starts under the default soft limit (1,024) and raises it to the hard one:
    1,500 idle connections (over the 1,024) leave it answering at once."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 4096:
        pytest.skip(f"the hard descriptor limit is {hard}: too low to hold the flood")
    fds = _fds()
    r = flood.run(1500, "raw", hold_s=6.0, before_s=2.0, after_s=1.0, nofile=f"1024:{hard}")
    assert r["conns_opened"] == 1500
    assert r["syncer_fd_limit"] == hard, r["syncer_line"]
    assert "raised from 1024" in r["syncer_line"]
    f = r["flood"]
    assert f["status_failed"] == 0 and f["longest_unanswered_s"] < 1.0, f
    assert f["status_max_s"] < 2.0, f
    assert f["rounds_per_s"] > 0.5 * r["before"]["rounds_per_s"], r
    assert _fds() <= fds + 2  # every socket of the flood closed


def test_where_the_limit_cannot_be_raised_the_flood_is_dropped_within_the_handshake_timeout():
    """Hard limit 1,024: the flood fills the connections the syncer takes; those that never
    handshake are dropped after HANDSHAKE_S, and the learner's rounds never stop."""
    fds = _fds()
    r = flood.run(1200, "raw", hold_s=6.0, before_s=2.0, after_s=1.0, nofile="1024:1024")
    assert r["conns_opened"] == 1200
    assert "hard limit is 1024" in r["syncer_line"]
    f = r["flood"]
    assert f["longest_unanswered_s"] < HANDSHAKE_S + 1.0, f  # before the limits: ~10 s
    assert f["status_answered"] > 0 and r["after"]["status_failed"] == 0, r
    assert f["rounds_per_s"] > 0.5 * r["before"]["rounds_per_s"], r
    assert _fds() <= fds + 2
