"""A custom model as the syncer's starting point: its parameters and which are embeddings.

`save_init(model, path)` writes a safetensors file of the parameters, by the names
`named_parameters()` gives (a tied tensor once), and the embedding names in its metadata;
`atoll syncer --init path` reads it (`file_plan`). `atoll syncer --init-from module:function`
builds the model itself (`model_from`) and starts from it (`model_plan`). Embeddings are found
from the model (atoll.model.embeddings) unless named explicitly.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from atoll.core.fragments import FragmentPlan, make_plan
from atoll.errors import ConfigError
from atoll.model.embeddings import allowed_names, embedding_names

EMBEDDINGS_KEY = "atoll.embeddings"  # safetensors metadata: a JSON list of tensor names
INIT_FROM_EXAMPLE = "e.g. examples.hf_causal_lm:build_model"


def save_init(
    model: torch.nn.Module, path: str | Path, embeddings: Iterable[str] | None = None
) -> None:
    """Write a model's parameters for `atoll syncer --init` (a custom model's starting point),
    with the names of its embedding tensors (detected, or `embeddings` if given)."""
    from safetensors.torch import save_file

    emb = sorted(embedding_names(model, embeddings))
    tensors = {n: p.detach().contiguous() for n, p in model.named_parameters()}
    save_file(tensors, str(path), metadata={EMBEDDINGS_KEY: json.dumps(emb)})


def read_init(path: str | Path) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The float32 tensors of a safetensors file, and the embedding names it stores (none for
    a file written without them)."""
    from safetensors import SafetensorError, safe_open

    if not Path(path).is_file():
        raise ConfigError("init", str(path), "an existing safetensors file (atoll.save_init)")
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k).float() for k in f.keys()}  # noqa: SIM118
        emb = set(json.loads(meta.get(EMBEDDINGS_KEY, "[]")))
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            "init", str(path), f"a safetensors file (atoll.save_init): {why}"
        ) from None
    return tensors, emb


def file_plan(
    path: str | Path, P: int, H: int, embeddings: set[str] | None, packing: str
) -> tuple[FragmentPlan, list[torch.Tensor]]:
    """Plan and initial values from a safetensors file of named tensors (a custom model).
    `embeddings`: explicit names, or None for those the file stores."""
    tensors, stored = read_init(path)
    emb = stored if embeddings is None else set(embeddings)
    for name in sorted(emb):
        if name not in tensors:
            raise ConfigError("embeddings", name, allowed_names(name, tensors))
    return _plan(tensors, P, H, emb, packing)


def model_plan(
    model: torch.nn.Module, P: int, H: int, embeddings: set[str] | None, packing: str
) -> tuple[FragmentPlan, list[torch.Tensor]]:
    """Plan and initial values from a model: its parameters, its detected embeddings (or
    `embeddings`, if given)."""
    emb = embedding_names(model, embeddings)
    tensors = {n: p.detach().float() for n, p in model.named_parameters()}
    return _plan(tensors, P, H, emb, packing)


def _plan(
    tensors: dict[str, torch.Tensor], P: int, H: int, emb: set[str], packing: str
) -> tuple[FragmentPlan, list[torch.Tensor]]:
    plan = make_plan({k: tuple(v.shape) for k, v in tensors.items()}, P, H, emb, packing)
    return plan, [plan.flatten(tensors, p) for p in range(plan.P)]


def import_function(spec: str, option: str) -> Any:
    """The function `module:function` names (for --OPTION), its module imported with the
    current directory on the path."""
    mod_name, _, fn_name = spec.partition(":")
    if not mod_name or not fn_name.isidentifier():
        raise ConfigError(option, spec, f"module:function ({INIT_FROM_EXAMPLE})")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        ours = exc.name is not None and (mod_name + ".").startswith(exc.name + ".")
        why = (
            f"no module {exc.name!r} here ({os.getcwd()}) or installed"
            if ours
            else f"module {mod_name} needs {exc.name!r}, which is not installed"
        )
        raise ConfigError(option, spec, f"module:function ({INIT_FROM_EXAMPLE}): {why}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        why = f"{mod_name} has no function {fn_name!r}"
        raise ConfigError(option, spec, f"module:function ({INIT_FROM_EXAMPLE}): {why}")
    return fn


def model_from(spec: str) -> torch.nn.Module:
    """The model that `module:function` returns (`atoll syncer --init-from`); the module is
    imported with the current directory on the path."""
    model = import_function(spec, "init-from")()
    if not isinstance(model, torch.nn.Module):
        got = type(model).__name__
        raise ConfigError("init-from", spec, f"a function returning a torch.nn.Module, not {got}")
    return model
