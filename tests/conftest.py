"""Fixtures shared by the tiers (their plain helpers are in tests/helpers.py)."""

from __future__ import annotations

import pytest

from tests.helpers import syncer_in_process


@pytest.fixture
def live(tmp_path):
    """The live syncer service in this process on loopback (integration and e2e tests only):
    (service, stub, exit codes, run directory)."""
    yield from syncer_in_process(tmp_path)
