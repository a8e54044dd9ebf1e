"""Helpers shared by the live commands: common arguments and the built-in model's plan."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from atoll.core.fragments import FragmentPlan, make_plan
from atoll.sim.config import SimConfig, add_set_argument


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="a .json or .toml file of settings (optional)")
    add_set_argument(
        p,
        "change a setting (simulator keys such as learners, steps, codec, and live keys "
        "such as port, chaos, shape_mbps; see docs/live.md)",
    )


def add_auth_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-id", default="atoll", help="the run's id; calls with another are refused")
    p.add_argument(
        "--secret-file",
        help="file holding the run's shared secret (default: the ATOLL_SECRET environment "
        "variable; never pass the secret itself on the command line)",
    )


def builtin_plan(cfg: SimConfig) -> tuple[FragmentPlan, list[torch.Tensor]]:
    """The built-in model's fragment plan and its seeded initial fragment values."""
    from atoll.sim.world import new_model

    model = new_model(cfg)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    plan = make_plan(shapes, cfg.P, cfg.H, model.embedding_names(), cfg.packing)
    params = dict(model.named_parameters())
    return plan, [plan.flatten(params, p) for p in range(plan.P)]


def file_plan(
    path: str | Path, P: int, H: int, embeddings: set[str], packing: str
) -> tuple[FragmentPlan, list[torch.Tensor]]:
    """Plan and initial values from a safetensors file of named tensors (a custom model)."""
    from safetensors.torch import load_file

    tensors = {k: v.float() for k, v in load_file(str(path)).items()}
    plan = make_plan({k: tuple(v.shape) for k, v in tensors.items()}, P, H, embeddings, packing)
    return plan, [plan.flatten(tensors, p) for p in range(plan.P)]


def save_init(model: torch.nn.Module, path: str | Path) -> None:
    """Write a model's parameters for `atoll syncer --init` (a custom model's starting point)."""
    from safetensors.torch import save_file

    save_file({n: p.detach().contiguous() for n, p in model.named_parameters()}, str(path))
