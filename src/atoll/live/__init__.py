"""The live runtime: a gRPC syncer service, the learner library and a local launcher.

- learner/     `Learner`: Decoupled DiLoCo for any PyTorch training loop (background comms)
- comm/        the learner's communication side (gRPC, encoding; threads or a child process)
- syncer/      `SyncerService`: the wall-clock driver of the core's syncer (handlers, runtime,
               outbox, store: the event tape, snapshots and restore, server)
- launcher.py  `atoll run`: syncer + N learner processes, chaos, supervisor, summary
See docs/live.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atoll.live.learner import Learner, LearnerOptions


def __getattr__(name: str) -> object:
    if name in ("Learner", "LearnerOptions"):
        from atoll.live import learner

        return getattr(learner, name)
    raise AttributeError(name)


__all__ = ["Learner", "LearnerOptions"]
