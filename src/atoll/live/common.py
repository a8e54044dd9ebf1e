"""Arguments shared by the live commands (settings, run id and secret)."""

from __future__ import annotations

import argparse
import ctypes
import signal

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


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """This process gets `sig` when its parent dies (Linux PR_SET_PDEATHSIG; elsewhere
    nothing): a supervised child, or an island's rank under a torchrun agent, does not outlive
    what started it."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG
    except OSError:
        pass
