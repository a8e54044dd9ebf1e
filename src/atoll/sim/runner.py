"""Run a preset: every method run in turn, results gathered into one JSON-able dict."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from atoll.core.fragments import make_plan
from atoll.model import GPT
from atoll.sim.baselines import run_data_parallel, run_sync_diloco
from atoll.sim.config import SimConfig, with_overrides
from atoll.sim.decoupled import DecoupledSim
from atoll.sim.presets import Preset
from atoll.sim.world import ProgressFn, RunResult, gpt_config


def run_one(cfg: SimConfig, name: str, progress: ProgressFn | None = None) -> RunResult:
    cfg = cfg.validate()
    if cfg.method == "data_parallel":
        result = run_data_parallel(cfg, name, progress)
    elif cfg.method == "sync_diloco":
        result = run_sync_diloco(cfg, name, progress)
    else:
        result = DecoupledSim(cfg, name, progress).run()
    return result


def plan_runs(preset: Preset, overrides: dict[str, object]) -> list[tuple[str, SimConfig]]:
    base = with_overrides(SimConfig(), {**preset.base, **overrides})
    runs = []
    for spec in preset.runs:
        cfg = with_overrides(base, spec.settings).validate()
        if cfg.method == "decoupled":
            check_plan(cfg)
        runs.append((spec.name, cfg))
    return runs


def check_plan(cfg: SimConfig) -> None:
    """Raise ConfigError now if the model cannot be split into cfg.P fragments."""
    model = GPT(gpt_config(cfg))
    make_plan(
        {n: tuple(p.shape) for n, p in model.named_parameters()},
        cfg.P,
        cfg.H,
        model.embedding_names(),
        cfg.packing,
    )


def run_preset(
    preset: Preset,
    overrides: dict[str, object],
    progress_factory: Callable[[str], ProgressFn] | None = None,
) -> dict:
    runs = plan_runs(preset, overrides)  # validate everything before spending compute
    out_runs = []
    for name, cfg in runs:
        progress = progress_factory(name) if progress_factory else None
        result = run_one(cfg, name, progress)
        result.settings = {
            k: v
            for k, v in dataclasses.asdict(cfg).items()
            if v != getattr(SimConfig(), k) or k == "method"
        }
        out_runs.append(dataclasses.asdict(result))
    return {
        "preset": preset.name,
        "seed": runs[0][1].seed,
        "overrides": overrides,
        "runs": out_runs,
    }
