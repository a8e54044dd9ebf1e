"""Devices by the user's model, not by defaults: where an island's own tensors go (by its
parameters and its group's backend), and which device the built-in learner (`atoll learner`,
`atoll run`'s learners) trains on and which backend its island's ranks use (by the `device`
setting and what the host has, so that NCCL is never chosen for a model left on the CPU)."""

from __future__ import annotations

import os
from collections.abc import Iterable

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


def island_device(
    backend: str, params: Iterable[torch.Tensor], local_rank: int | None = None
) -> torch.device:
    """The device of the tensors an island hands its collectives (commands, token counts,
    pickled objects), by what the group's backend carries:

    - a backend that carries CPU tensors (gloo, or a mixed "cpu:gloo,cuda:nccl" group): the CPU;
    - NCCL alone: the parameters' GPU (the user's `.to(f"cuda:{local_rank}")`, whatever
      `torch.cuda.current_device()` says), or `cuda:LOCAL_RANK` for a model without parameters.

    NCCL with parameters off the GPU stops here, naming both, before any collective."""
    if "gloo" in backend or "mpi" in backend:
        return torch.device("cpu")
    devices = {p.device for p in params}
    if "nccl" not in backend:  # another backend: it carries what the parameters are on
        return next(iter(devices), torch.device("cpu"))
    off = sorted(str(d) for d in devices if d.type != "cuda")
    if off:
        raise ConfigError(
            "process group backend",
            f"nccl with parameters on {', '.join(off)}",
            "parameters on a GPU for NCCL (model.to(f'cuda:{local_rank}') before atoll.Learner), "
            "or a gloo group for a CPU model",
        )
    if not devices:
        rank = local_rank if local_rank is not None else int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", rank)
    if len(devices) > 1:
        raise ConfigError(
            "parameters", ", ".join(sorted(map(str, devices))), "one GPU per rank of an island"
        )
    (device,) = devices
    # "cuda" without an index is the current device: resolved now, while it is the user's
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
