"""`atoll demo`: `atoll run` with demo settings: 4 learners on this machine, L3 40% slower,
L1 killed mid-run and restarted by the supervisor; a few minutes on a laptop CPU. Learners run
free (no pacing): the syncer's pull schedule gathers learners of any speed into the same rounds."""

from __future__ import annotations

import argparse

from atoll.live import run_cli

DEMO: dict[str, object] = {
    "learners": 4,
    "steps": 500,
    "pace_s": 0.0,
    "speeds": "1,1,1,1.4",
    "chaos": "kill:L1@12+3",  # mid-run: training starts ~5 s in, ends ~25-30 s in (2 cores)
    "schedule": "pull",
    # K=1 with the grace window: the pull schedule keeps the slow and the restarted learner in
    # the same rounds as the others (on the push schedule K=1 diverged here, eval loss 23.3,
    # because out-of-phase learners made one-learner rounds; it needed K=2 and pacing).
    "quorum": 1,
    "grace": True,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    run_cli.add_arguments(p)


def main(args: argparse.Namespace) -> int:
    rc = run_cli.main(args, DEMO, page=True)
    if rc == 0:
        from atoll.report import try_report

        try_report(run_cli.run_dir(args))  # prints its path, or one warning line
    return rc
