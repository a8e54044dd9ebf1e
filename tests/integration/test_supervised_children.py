"""A supervised child (a learner or syncer that `atoll run` or a shard set starts) ties its life
to its parent at its own start (atoll.live.common.tie_to_parent), not in a preexec_fn: a fork
of a process that has used gRPC, with Python code to run before exec, loses a few children in
a hundred."""

import os
import subprocess
import sys

from atoll.live.common import PARENT_PID, supervised_env

CHILD = (
    "import os; from atoll.live.common import tie_to_parent; tie_to_parent(); "
    f"print(os.environ.get({PARENT_PID!r}))"
)


def test_a_supervised_child_ties_itself_to_its_parent_and_hands_nothing_down():
    env = supervised_env()
    assert env[PARENT_PID] == str(os.getpid())
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stderr  # removed


def test_a_child_whose_parent_is_gone_exits_at_once_saying_so():
    env = {**os.environ, PARENT_PID: "1"}  # not its parent: as if the parent had died
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
    assert out.returncode == 1
    assert "the process that started this one (1) has exited" in out.stderr
