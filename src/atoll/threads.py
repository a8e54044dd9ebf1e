"""Background threads that never die silently.

Every background thread of atoll (the syncer's timers, reaper and snapshots; a learner's
communication threads) is started through `guarded`: if its function raises, the traceback
goes to stderr and `on_death(name, exc)` runs in the dying thread. The owner decides what a
death means: the syncer writes a `thread_died` event and exits non-zero, so that its
supervisor restarts it from its tape; a learner's communication side reports `CommFailed`,
and the learner raises it from its next `step()`. Errors a thread expects (a network call that
fails, a full disk for a snapshot) are handled inside the thread and never reach here.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable

OnDeath = Callable[[str, BaseException], None]


def guarded(name: str, fn: Callable[[], None], on_death: OnDeath) -> threading.Thread:
    """A daemon thread (not started) running `fn`; `on_death` if it raises."""

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - every death is reported
            print(f"atoll: thread {name} died: {exc!r}", file=sys.stderr, flush=True)
            traceback.print_exc(file=sys.stderr)
            on_death(name, exc)

    return threading.Thread(target=run, name=name, daemon=True)
