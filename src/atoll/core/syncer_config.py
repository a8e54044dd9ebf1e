"""The syncer protocol's settings (`SyncerConfig`), checked once (`validate`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from atoll.core import fused
from atoll.core.choices import check_choices
from atoll.errors import ConfigError


@dataclass(frozen=True)
class SyncerConfig:
    quorum: int = 1
    tau: int = 2
    grace: bool = True
    grace_gamma: float = 0.5
    grace_ema: float = 0.1
    merge: str = "rda"
    weighting: str = "tokens"  # "tokens" (tokens^2/steps) or "uniform"
    light_rounds: str = "scale"  # "scale": by its weight against the usual round's; "full"
    outer: str = "sgd"  # measured best at small scale; "nesterov" (0.7, 0.9) is the paper's
    outer_lr: float = 1.0
    outer_momentum: float = 0.9
    outer_delay: int = 4
    down_codec: str = "int4"
    heal_codec: str = "int8"  # a fragment sent whole: heals, an overflowing queue
    group: int = 64
    history: int = 64  # public versions kept per fragment to resolve learners' base versions
    history_full_every: int = 16  # every n-th version in full, the others as frames; 0: frames only
    history_bytes: int = 0  # bound on the history's bytes (0: only `history` bounds it)
    schedule: str = "pull"  # "pull": the syncer paces rounds; "push": learners' step counts
    codec: str = ""  # the learners' codec: contributions in another are refused ('' = any)
    guard: float = 10.0  # magnitude guard factor (core/guard.py); 0 = off
    # the round's data path (core/fused.py): numba kernels for large fragments ("auto"), for
    # every fragment ("on"), or the torch reference path ("off"); on `syncer_threads` threads
    # ("auto": every core the process may use)
    fused: str = "auto"
    syncer_threads: str = "auto"

    def validate(self) -> None:
        check_choices(self, empty_ok=("codec",))  # the learners' codec: '' = any
        if self.history < 2:
            raise ConfigError("history", self.history, "an integer >= 2")
        if self.history_full_every < 0:
            raise ConfigError(
                "history_full_every", self.history_full_every, "an integer >= 0 (0: frames only)"
            )
        if self.history_bytes < 0:
            raise ConfigError("history_bytes", self.history_bytes, "0 (no bound) or bytes > 0")
        if not (self.guard == 0 or 1 < self.guard < math.inf):
            raise ConfigError("guard", self.guard, "0 (off) or a number > 1")
        fused.check(self.fused, self.syncer_threads)
