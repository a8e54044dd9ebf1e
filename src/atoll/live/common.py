"""Arguments shared by the live commands (settings, run id and secret)."""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
from collections.abc import Mapping

from atoll.config import add_set_argument


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="a .json or .toml file of settings (optional)")
    add_set_argument(
        p,
        "change a setting (simulator keys such as learners, steps, codec, and live keys "
        "such as port, chaos, shape_mbps; see docs/live.md)",
    )


def add_auth_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-id", default="atoll", help="the run's id; calls with another are refused")
    p.add_argument(
        "--secret-file",
        help="file holding the run's shared secret (default: the ATOLL_SECRET environment "
        "variable; never pass the secret itself on the command line)",
    )


PARENT_PID = "ATOLL_PARENT_PID"  # set for a supervised child (`supervised_env`)


def supervised_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child this process supervises: the child ties its life to this
    process at its start (`tie_to_parent`, atoll.cli). Not a `preexec_fn`: Python code that
    runs between fork and exec in a process that uses gRPC loses children (2 to 4 in 100 died
    before exec here; none without it)."""
    return {**(os.environ if env is None else env), PARENT_PID: str(os.getpid())}


def tie_to_parent() -> None:
    """At a supervised child's start: SIGTERM when its parent dies (`die_with_parent`); an
    exit at once when that parent is gone already. The variable is removed, so that this
    process's own children (an island's ranks) do not take it for theirs."""
    pid = os.environ.pop(PARENT_PID, None)
    if not pid:
        return
    die_with_parent()
    if os.getppid() != int(pid):
        raise SystemExit(f"atoll: the process that started this one ({pid}) has exited")


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """This process gets `sig` when its parent dies (Linux PR_SET_PDEATHSIG; elsewhere
    nothing): a supervised child, or an island's rank under a torchrun agent, does not outlive
    what started it."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG
    except OSError:
        pass
