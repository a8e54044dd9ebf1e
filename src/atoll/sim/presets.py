"""Named experiments: a base configuration and the method runs compared under it.

Every run of a preset uses the same seed, data, initialisation and token budget.
`--set key=value` changes the base of every run; a run's own settings then apply on top
(so `--set quorum=2` does not override the quorum a run is *about*).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from atoll.errors import ConfigError


@dataclass(frozen=True)
class RunSpec:
    name: str
    settings: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    base: dict[str, object]
    runs: tuple[RunSpec, ...]


_DECOUPLED = {"method": "decoupled", "quorum": 1, "grace": True, "codec": "int4"}

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "quick",
            "Decoupled DiLoCo (M=4, K=1 + grace, int4) beside data-parallel, ~30 s on 2 cores",
            {"steps": 150},
            (
                RunSpec("decoupled", _DECOUPLED),
                RunSpec("data_parallel", {"method": "data_parallel"}),
            ),
        ),
        Preset(
            "compare",
            "data-parallel vs synchronous DiLoCo vs Decoupled DiLoCo at equal tokens",
            {"steps": 600, "bandwidth_mbps": 100.0, "down_codec": "int4"},
            (
                RunSpec("data_parallel", {"method": "data_parallel"}),
                RunSpec("sync_diloco", {"method": "sync_diloco"}),
                RunSpec("decoupled", _DECOUPLED),
            ),
        ),
        Preset(
            "hetero",
            "mixed hardware: half the learners 18% slower, 10% step-time noise; K=M vs K=1 vs "
            "K=1 + grace",
            {"steps": 400, "speeds": "1,1,1.18,1.18", "speed_noise": 0.1},
            (
                RunSpec("decoupled_K=M", {"method": "decoupled", "quorum": 4, "grace": False}),
                RunSpec("decoupled_K=1", {"method": "decoupled", "quorum": 1, "grace": False}),
                RunSpec("decoupled_K=1+grace", {"method": "decoupled", "quorum": 1, "grace": True}),
            ),
        ),
        Preset(
            "failures",
            "learners fail (Poisson, MTBF 300 simulated s) and rejoin after ~20 s; Decoupled "
            "vs data-parallel, each with and without failures",
            {"steps": 400, "downtime_s": 20.0},
            (
                RunSpec("decoupled_no_failures", {**_DECOUPLED, "mtbf_s": 0.0}),
                RunSpec("decoupled_failures", {**_DECOUPLED, "mtbf_s": 300.0}),
                RunSpec("data_parallel_no_failures", {"method": "data_parallel", "mtbf_s": 0.0}),
                RunSpec("data_parallel_failures", {"method": "data_parallel", "mtbf_s": 300.0}),
            ),
        ),
    ]
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError("preset", name, f"one of {sorted(PRESETS)}")
    return PRESETS[name]
