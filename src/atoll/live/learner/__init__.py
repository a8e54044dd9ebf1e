"""The learner library (see `api.Learner`).

- api.py       `Learner`: Decoupled DiLoCo for any PyTorch training loop
- options.py   `LearnerOptions`: what it takes besides the model, optimizer and address
- ports.py     where its communication side runs (atoll.live.comm): threads, or a child
               process; the messages between the sides are atoll.live.comm.messages

`Learner` is imported on first use (importing the package loads no torch model code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atoll.live.learner.api import Learner
    from atoll.live.learner.options import LearnerOptions


def __getattr__(name: str) -> object:
    if name == "Learner":
        from atoll.live.learner import api

        return getattr(api, name)
    if name == "LearnerOptions":
        from atoll.live.learner import options

        return options.LearnerOptions
    raise AttributeError(f"module 'atoll.live.learner' has no attribute {name!r}")


__all__ = ["Learner", "LearnerOptions"]
