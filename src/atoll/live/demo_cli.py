"""`atoll demo`: `atoll run` with demo settings: 4 learners on this machine, L3 40% slower,
L1 killed mid-run and restarted by the supervisor; a few minutes on a laptop CPU."""

from __future__ import annotations

import argparse

from atoll.live import run_cli

DEMO: dict[str, object] = {
    "learners": 4,
    "steps": 500,
    "speeds": "1,1,1,1.4",
    "chaos": "kill:L1@25+3",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    run_cli.add_arguments(p)


def main(args: argparse.Namespace) -> int:
    return run_cli.main(args, DEMO)
