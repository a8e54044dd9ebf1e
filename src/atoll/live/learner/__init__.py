"""The learner library (see `api.Learner`).

- api.py       `Learner`: Decoupled DiLoCo for any PyTorch training loop
- ports.py     where its communication side runs: threads, or a child process
- messages.py  what the training side and the communication side say to each other
- framing.py   those messages over the child's socket pair

`Learner` is imported on first use, so that the communication process (atoll.live.comm.child)
can import the messages without the training side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atoll.live.learner.api import Learner


def __getattr__(name: str) -> object:
    if name == "Learner":
        from atoll.live.learner import api

        return getattr(api, name)
    raise AttributeError(f"module 'atoll.live.learner' has no attribute {name!r}")


__all__ = ["Learner"]
