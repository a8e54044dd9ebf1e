"""atoll: Decoupled DiLoCo for training one model across independent, failure-prone islands."""

from typing import TYPE_CHECKING

from atoll.errors import (
    AuthError,
    CommError,
    ConfigError,
    JoinError,
    JoinTimeoutError,
    LearnerError,
    RunError,
)
from atoll.torch_floor import check_installed

check_installed()  # an older torch stops here, in one line, before any module imports it

__version__ = "0.1.0"

if TYPE_CHECKING:
    from atoll.live import Learner, LearnerOptions
    from atoll.model.custom import save_init


def __getattr__(name: str) -> object:
    # `atoll.Learner`, `atoll.save_init` without importing torch/grpc for every `import atoll`
    if name in ("Learner", "LearnerOptions"):
        from atoll import live

        return getattr(live, name)
    if name == "save_init":
        from atoll.model.custom import save_init

        return save_init
    raise AttributeError(f"module 'atoll' has no attribute {name!r}")


__all__ = [
    "AuthError",
    "CommError",
    "ConfigError",
    "JoinError",
    "JoinTimeoutError",
    "Learner",
    "LearnerOptions",
    "LearnerError",
    "RunError",
    "__version__",
    "save_init",
]
