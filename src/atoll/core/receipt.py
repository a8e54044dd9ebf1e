"""What a learner does with a global fragment value it receives (the answer to its send).

- overwrite (default): theta <- Theta. The tau steps of local progress made on this fragment
  since it was sent are dropped; counters restart at zero.
- blend(alpha): theta <- alpha*theta + (1-alpha)*Theta (Streaming DiLoCo's mixing).
- carry: theta <- Theta + (theta - theta_at_send): keep the local progress made since the
  send; the counters keep the steps and tokens since the send, so that progress is weighted
  when it is sent next time.
"""

from __future__ import annotations

import torch

from atoll.core.choices import RECEIPT_MODES
from atoll.errors import ConfigError


def check_mode(mode: str, alpha: float) -> None:
    if mode not in RECEIPT_MODES:
        raise ConfigError("receipt", mode, f"one of {RECEIPT_MODES}")
    if not 0 <= alpha < 1:
        raise ConfigError("receipt_alpha", alpha, "a number in [0, 1)")


def receive(
    mode: str,
    local: torch.Tensor,
    global_value: torch.Tensor,
    at_send: torch.Tensor | None = None,
    alpha: float = 0.5,
) -> torch.Tensor:
    """The learner's new value of a fragment (flat tensors)."""
    if mode == "overwrite":
        return global_value.clone()
    if mode == "blend":
        return alpha * local + (1 - alpha) * global_value
    if mode == "carry":
        if at_send is None:
            raise ValueError("carry needs the fragment's value at send time")
        return global_value + (local - at_send)
    raise ConfigError("receipt", mode, f"one of {RECEIPT_MODES}")
