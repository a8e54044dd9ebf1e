"""Which device the built-in learner (`atoll learner`, `atoll run`'s learners) trains on, and
which torch.distributed backend its island's ranks use: both from the `device` setting and
what the host has, so that NCCL is never chosen for a model left on the CPU."""

from __future__ import annotations

import torch

from atoll.config.live import DEVICES
from atoll.errors import ConfigError


def learner_device(
    setting: str, local_rank: int, ranks: int = 1, gpus: int | None = None
) -> torch.device:
    """The device of rank `local_rank` of a learner of `ranks` ranks on this host: with
    `setting` "auto", `cuda:local_rank` when this host has a GPU for it, else the CPU; "cuda"
    without enough GPUs stops in one line, before anything starts. `gpus`: the host's count
    (default: torch.cuda.device_count())."""
    if setting not in DEVICES:
        raise ConfigError("device", setting, f"one of {', '.join(DEVICES)}")
    if setting == "cpu":
        return torch.device("cpu")
    gpus = torch.cuda.device_count() if gpus is None else gpus
    if gpus == 0:
        if setting == "cuda":
            raise ConfigError("device", setting, "auto or cpu: this host has no GPU torch sees")
        return torch.device("cpu")
    if ranks > gpus:
        raise ConfigError(
            "island ranks on this host",
            ranks,
            f"at most the host's {gpus} GPU(s) (one GPU per rank), or --set device=cpu",
        )
    return torch.device("cuda", local_rank)


def backend_for(device: torch.device) -> str:
    """The island's process-group backend for ranks on `device`: NCCL for GPUs, gloo else."""
    return "nccl" if device.type == "cuda" else "gloo"
