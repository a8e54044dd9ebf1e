"""Outer optimizers: applied by the syncer to a fragment's global value with the merged
outer gradient delta (delta = Theta - theta_learner, so it points *against* progress, like a
gradient).

- nesterov (default, lr 0.7, momentum 0.9 as in the DiLoCo lineage):
      buf <- mu*buf + delta;  Theta <- Theta - lr*(delta + mu*buf)
- delayed_nesterov (after Asynchronous Local-SGD, arXiv 2401.09135): every merge takes a plain
  step Theta <- Theta - lr*delta; every N-th merge also refreshes the momentum with the mean of
  the last N deltas, buf <- mu*buf + mean, and applies it for all N merges at once,
  Theta <- Theta - lr*N*mu*buf. With N = 1 it equals nesterov. Async arrivals thus move
  Theta at once, while momentum only builds from averaged, less stale information.
- sgd: Theta <- Theta - lr*delta (lr 1 gives plain averaging, i.e. FedAvg).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atoll.core.choices import OUTER_OPTIMIZERS
from atoll.errors import ConfigError


@dataclass
class OuterState:
    buf: torch.Tensor | None = None
    acc: torch.Tensor | None = None
    count: int = 0


class OuterOptimizer:
    def __init__(
        self, kind: str = "nesterov", lr: float = 0.7, momentum: float = 0.9, delay: int = 4
    ) -> None:
        if kind not in OUTER_OPTIMIZERS:
            raise ConfigError("outer", kind, f"one of {OUTER_OPTIMIZERS}")
        if not lr > 0:
            raise ConfigError("outer_lr", lr, "a number > 0")
        if not 0 <= momentum < 1:
            raise ConfigError("outer_momentum", momentum, "a number in [0, 1)")
        if delay < 1:
            raise ConfigError("outer_delay", delay, "an integer >= 1")
        self.kind, self.lr, self.mu, self.delay = kind, lr, momentum, delay

    def step(self, theta: torch.Tensor, delta: torch.Tensor, state: OuterState) -> torch.Tensor:
        """Return the new Theta (a new tensor); `state` is updated in place."""
        if self.kind == "sgd":
            return theta - self.lr * delta
        if state.buf is None:
            state.buf = torch.zeros_like(theta)
        if self.kind == "nesterov":
            state.buf = self.mu * state.buf + delta
            return theta - self.lr * (delta + self.mu * state.buf)
        # delayed nesterov
        state.acc = delta.clone() if state.acc is None else state.acc + delta
        state.count += 1
        if state.count < self.delay:
            return theta - self.lr * delta
        state.buf = self.mu * state.buf + state.acc / state.count
        n = state.count
        state.acc, state.count = None, 0
        return theta - self.lr * (delta + n * self.mu * state.buf)
