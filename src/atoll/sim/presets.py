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
_HETERO = {"method": "decoupled", "speeds": "1,1,1.18,1.18", "speed_noise": 0.1}

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
            "data-parallel vs synchronous DiLoCo vs Decoupled DiLoCo at equal tokens, 100 Mbps "
            "links, 16k tokens per learner step (a learner is a data-parallel job of its own)",
            {
                "steps": 120,
                "batch": 256,
                "warmup": 10,
                "bandwidth_mbps": 100.0,
                "down_codec": "int4",
            },
            (
                RunSpec("data_parallel", {"method": "data_parallel"}),
                RunSpec("sync_diloco", {"method": "sync_diloco"}),
                RunSpec("decoupled", _DECOUPLED),
            ),
        ),
        Preset(
            "hetero",
            "mixed hardware: half the learners 18% slower, 10% step-time noise; K=M vs K=1 vs "
            "K=1 + grace (syncer-paced rounds), and K=M / K=1 + grace with learner-paced rounds",
            # inner lr 1e-3: at 3e-3 with 1k-token batches, averaging diverged learners is worse
            # than adopting one of them, so no merge rule can matter (BENCHMARKS.md, hetero)
            {"steps": 300, "lr": 1e-3},
            (
                RunSpec("K=M", {**_HETERO, "quorum": 4, "grace": False}),
                RunSpec("K=1", {**_HETERO, "quorum": 1, "grace": False}),
                RunSpec("K=1+grace", {**_HETERO, "quorum": 1, "grace": True}),
                RunSpec("push:K=M", {**_HETERO, "quorum": 4, "grace": False, "schedule": "push"}),
                RunSpec(
                    "push:K=1+grace", {**_HETERO, "quorum": 1, "grace": True, "schedule": "push"}
                ),
            ),
        ),
        Preset(
            "failures",
            "learners fail (Poisson, MTBF 400 simulated s each) and rejoin after ~20 s; "
            "Decoupled vs data-parallel, each with and without failures",
            {"steps": 600, "downtime_s": 20.0},
            (
                RunSpec("decoupled_no_failures", {**_DECOUPLED, "mtbf_s": 0.0}),
                RunSpec("decoupled_failures", {**_DECOUPLED, "mtbf_s": 400.0}),
                RunSpec("data_parallel_no_failures", {"method": "data_parallel", "mtbf_s": 0.0}),
                RunSpec("data_parallel_failures", {"method": "data_parallel", "mtbf_s": 400.0}),
            ),
        ),
    ]
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError("preset", name, f"one of {sorted(PRESETS)}")
    return PRESETS[name]
