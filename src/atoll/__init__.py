"""atoll: Decoupled DiLoCo for training one model across independent, failure-prone islands."""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from atoll.live import Learner


def __getattr__(name: str) -> object:
    # `atoll.Learner` without importing torch/grpc for every `import atoll`
    if name == "Learner":
        from atoll.live import Learner

        return Learner
    raise AttributeError(f"module 'atoll' has no attribute {name!r}")


__all__ = ["Learner", "__version__"]
