"""Where a built-in learner's communication runs, decided on this machine at run time."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from atoll.config.live import check_comm


def resolve_comm(mode: str, learners_here: int, cores: int | None = None) -> str:
    """ "auto" -> "process" with at least 2 cores per learner on this machine, else "thread".

    Measured (docs/live.md): with cores to spare, a child process per learner keeps the
    communication off the training loop's GIL (+2.3% per step vs +4 to +5% for threads); with 4
    learners on 2 cores the extra processes cost more than they save (atoll demo: goodput
    76.6% vs 81.0%, rejoin 9.0 s vs 3.7 s)."""
    if check_comm(mode) != "auto":
        return mode
    if cores is None:  # the cores this process may run on (affinity), not the host's count
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        cores = cores or os.cpu_count() or 1
    return "process" if cores >= 2 * max(learners_here, 1) else "thread"


def learners_on_host(settle_s: float = 0.5, folder: Path | None = None) -> int:
    """How many learner processes run on this machine, this one included: each registers its
    pid in a per-user folder (`<tmp>/atoll-<uid>/learners`) and counts the registered pids that
    are alive. It waits `settle_s` after registering, so learners started together (a launcher,
    a script starting four) count each other. The entry stays until the process exits (dead
    pids are ignored and removed by the next count)."""
    folder = folder or Path(tempfile.gettempdir()) / f"atoll-{os.getuid()}" / "learners"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / str(os.getpid())).touch()
    except OSError:
        return 1
    time.sleep(settle_s)
    alive = 0
    for f in folder.iterdir():
        try:
            os.kill(int(f.name), 0)
            alive += 1
        except (ValueError, ProcessLookupError):
            f.unlink(missing_ok=True)
        except PermissionError:
            alive += 1  # alive, another user's
    return max(alive, 1)
