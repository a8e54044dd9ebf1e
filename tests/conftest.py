"""Fixtures shared by the tiers (their plain helpers are in tests/helpers.py)."""

from __future__ import annotations

import os
import resource
import time

import pytest
from hypothesis import settings

from tests.helpers import syncer_in_process

# property tests draw the same examples on every run (the suite and CI must not fail on a case
# drawn by chance: in one session two such runs found ill-conditioned merges whose tolerance
# the tests did not state, one fixed in test_fused, one open: see test_merge_stream). To
# explore new cases: ATOLL_HYPOTHESIS=explore (random draws, as hypothesis does by default).
settings.register_profile("atoll", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile("explore" if os.environ.get("ATOLL_HYPOTHESIS") == "explore" else "atoll")


@pytest.fixture
def live(tmp_path):
    """The live syncer service in this process on loopback (integration and e2e tests only):
    (service, stub, exit codes, run directory)."""
    yield from syncer_in_process(tmp_path)


# -- where the suite's CPU goes: ATOLL_TEST_CPU=FILE appends, per test, the CPU seconds of the
# test's process and of the processes it started and waited for (getrusage), and its wall time
if _cpu_log := os.environ.get("ATOLL_TEST_CPU"):

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        def cpu():
            s, c = (
                resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN),
            )
            return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime

        (s0, c0), t0 = cpu(), time.monotonic()
        yield
        (s1, c1), t1 = cpu(), time.monotonic()
        with open(_cpu_log, "a") as fh:
            fh.write(f"{s1 - s0:.2f} {c1 - c0:.2f} {t1 - t0:.2f} {item.nodeid}\n")
