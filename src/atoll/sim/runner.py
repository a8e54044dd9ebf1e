"""Run a preset: every method run in turn, results gathered into one JSON-able dict."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from atoll.config import JobConfig, SimConfig
from atoll.core.fragments import make_plan
from atoll.eventlog import write_events
from atoll.model.recipe import CorpusCache, new_model
from atoll.sim.baselines import run_data_parallel, run_sync_diloco
from atoll.sim.decoupled import DecoupledSim
from atoll.sim.presets import Preset
from atoll.sim.world import ProgressFn, RunResult


def run_one(
    cfg: SimConfig,
    name: str,
    progress: ProgressFn | None = None,
    events_path: Path | None = None,
    corpora: CorpusCache | None = None,
) -> RunResult:
    """Run one method; a Decoupled run can write its event stream as JSON lines. `corpora`:
    corpora already read (by an earlier run of the same preset), else the run reads its own."""
    cfg = cfg.validate()
    corpus = corpora.get(cfg) if corpora is not None else None
    if cfg.method == "data_parallel":
        return run_data_parallel(cfg, name, progress, corpus=corpus)
    if cfg.method == "sync_diloco":
        return run_sync_diloco(cfg, name, progress, corpus=corpus)
    sim = DecoupledSim(cfg, name, progress, corpus=corpus)
    result = sim.run()
    if cfg.scenario:  # what the chaos scenario did (not a RunResult field: runs without one
        result.chaos = sim.faults.summary()  # keep their JSON as it was)
    if events_path is not None:
        events_path.parent.mkdir(parents=True, exist_ok=True)
        write_events(events_path, sim.events)
    return result


def plan_runs(preset: Preset, overrides: dict[str, object]) -> list[tuple[str, SimConfig]]:
    """Each run's settings: the preset's base < `overrides` < the run's own, validated."""
    base = JobConfig().with_keys({**preset.base, **overrides})
    runs = []
    for spec in preset.runs:
        cfg = base.with_keys(spec.settings).validate().sim
        if cfg.method == "decoupled":
            check_plan(cfg)
        runs.append((spec.name, cfg))
    return runs


def check_plan(cfg: SimConfig) -> None:
    """Raise ConfigError now if the model cannot be split into cfg.P fragments."""
    model = new_model(cfg)
    make_plan(
        {n: tuple(p.shape) for n, p in model.named_parameters()},
        cfg.P,
        cfg.H,
        model.embedding_names(),
        cfg.packing,
    )


def read_corpora(runs: list[tuple[str, SimConfig]]) -> CorpusCache:
    """The runs' corpora, read once and checked (bad data stops here, before any compute)."""
    corpora = CorpusCache()
    for _, cfg in runs:
        corpora.get(cfg)
    return corpora


def run_preset(
    preset: Preset,
    overrides: dict[str, object],
    progress_factory: Callable[[str], ProgressFn] | None = None,
    events_dir: Path | None = None,
    corpora: CorpusCache | None = None,
) -> dict:
    """Every run of `preset`; `corpora`: the runs' corpora if already read (`read_corpora`)."""
    runs = plan_runs(preset, overrides)  # validate everything before spending compute
    out_runs = []
    if corpora is None:
        corpora = read_corpora(runs)  # the runs share the corpus, read once
    for name, cfg in runs:
        progress = progress_factory(name) if progress_factory else None
        events = events_dir / f"events-{name}.jsonl" if events_dir else None
        result = run_one(cfg, name, progress, events, corpora)
        result.settings = {
            k: v
            for k, v in dataclasses.asdict(cfg).items()
            if v != getattr(SimConfig(), k) or k == "method"
        }
        out = dataclasses.asdict(result)
        if getattr(result, "chaos", None):
            out["chaos"] = result.chaos
        out_runs.append(out)
    return {
        "preset": preset.name,
        "seed": runs[0][1].seed,
        "overrides": overrides,
        "runs": out_runs,
    }
