"""`atoll demo`: `atoll run` with demo settings: 4 learners on this machine, L3 40% slower,
L1 killed mid-run and restarted by the supervisor; a few minutes on a laptop CPU. Steps are
paced at 0.15 s (x1.4 for L3) so that four learners fit on a two-core machine in phase."""

from __future__ import annotations

import argparse

from atoll.live import run_cli

DEMO: dict[str, object] = {
    "learners": 4,
    "steps": 500,
    "pace_s": 0.15,
    "speeds": "1,1,1,1.4",
    "chaos": "kill:L1@25+3",
    # K=2: on the live wire's step-count schedule the slow and the restarted learner drift out
    # of phase; with K=1 their rounds then hold one learner each, and the extra outer steps
    # diverged (eval loss 23.3 in one measured run); K=2 gave 2.62 (1.99 participants/round).
    "quorum": 2,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    run_cli.add_arguments(p)


def main(args: argparse.Namespace) -> int:
    return run_cli.main(args, DEMO)
