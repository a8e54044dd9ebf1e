"""`atoll learner` with a secret the syncer refuses, or an address that cannot be one: one line
on stderr, exit 2, before torch and the data are loaded (the live syncer in this process)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.helpers import RUN

pytestmark = pytest.mark.slow


def _learner(*argv: str, secret: str) -> tuple[int, str, float]:
    env = {**os.environ, "ATOLL_SECRET": secret, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "atoll.cli", "learner", "--run-id", RUN, *argv]
    t0 = time.monotonic()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    return res.returncode, res.stderr, time.monotonic() - t0


def test_a_wrong_secret_and_a_bad_address_are_one_line_and_exit_2(live):
    service, _, _, _ = live
    address = f"127.0.0.1:{service.port}"
    rc, err, took = _learner("--syncer", address, secret="not-the-secret-123")
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"atoll learner: error: learner L0: the syncer at {address} refused")
    assert "missing or wrong shared secret" in err
    assert service.auth.refused == 1  # the check alone: no model built, no Join
    assert took < 60, took  # before: a traceback after the data, the model and a child process
    for bad in ("", "host", "host:99999"):
        rc, err, _ = _learner("--syncer", bad, secret="not-the-secret-123")
        assert rc == 2 and err.count("\n") == 1, err
        assert err.startswith(f"atoll learner: error: --syncer={bad!r} is not allowed: host:port")
    assert service.auth.refused == 1  # nothing asked with a malformed address
