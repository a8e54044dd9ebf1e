"""Capacity plan for the syncer: shards, cores, RAM and bandwidth, from measured rates.

Notation as in `atoll.bandwidth.model`: N parameters, s seconds per inner step, P fragments,
H inner steps between syncs of a fragment, tau overlap steps, M learners (one per
datacenter or island).

CPU. Each learner sends each fragment once every H steps, so the syncer takes in
M * P / (H * s) contributions per second, each of N / P values. One contribution costs

    cpu = PER_CONTRIBUTION_S + NS_PER_VALUE * 1e-9 * N / P        (seconds of one core)

fitted through two sizes of the running syncer (`benchmarks/syncer_service.py`, BENCHMARKS.md
section 10c: `atoll syncer` with its default settings, the fused round and the tape, M = 8
learners pushing int4 frames over loopback, models of 25.5M and 101M parameters, P = 24:
1.07M and 4.1M values a contribution): the whole process's CPU time (user and system: gRPC,
decompression, checks, merge, outer step, broadcast encode, tape record, sends, heartbeats)
less its snapshots', per contribution, a line through both sizes (each the median of 3 runs).
Rounds of M contributions, as a live run has them (the fit of earlier versions came from
one-learner rounds).
A shard's protocol runs under one lock (the round's kernels may use `syncer_threads` cores,
BENCHMARKS.md section 10b: 1.65x on 2; the service with threads is not measured here), so the
plan keeps each shard at or under `max_core_load` of one core (0.5 by default: section 4's core
at 95% had round latency p50 1.9 s and p99 5 s) and gives each shard 2 cores (one for the round,
one so that the gRPC server's threads, TLS and the snapshot writer do not take from it).

Snapshots (every `snapshot_every_s`, the syncer's default 10 s) are separate: SNAPSHOT_NS_PER_BYTE
of CPU per byte of the snapshot file, measured by the same benchmark (its snapshot thread's CPU
time over the file's size, the larger model). A snapshot holds 8 + 4 * snapshot_history bytes
per parameter once the history is full.

Disk. Every merge is a tape record of the fragment's new exact and public values and outer
state (`TAPE_BYTES_PER_VALUE` + the outer optimizer's bytes, per value), written before it is
broadcast: (8 + outer) * N / (H * s) bytes per second, on top of the snapshots'.

Memory: `syncer_bytes_per_param`, from the syncer's own formula (atoll.core.memory.memory_bytes,
docs/live.md "Syncer memory": Theta and the public value in fp32, the history as the int4
frames that were broadcast with a full copy every 16 versions, or frames only with
`history_full_every` 0, outer-optimizer buffers, open rounds, heal frames, and a snapshot's
copies at its peak; `steady_bytes_per_param` without the snapshot or a closing round), plus
PROCESS_BYTES per shard process.

Bandwidth: per learner link and per direction, `atoll.bandwidth.model.average_rate` of the
decoupled method with the calibrated fixed costs of a live run (BENCHMARKS.md section 7:
up framing 1.099, 463 B per exchange, 4,032 bit/s of heartbeats; down 1.092, 431 B,
2,828 bit/s); the syncer's links carry M times that, split over its shards by bytes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from atoll.bandwidth.model import BandwidthConfig, average_rate, required_bandwidth, utilization
from atoll.core.memory import memory_bytes
from atoll.core.syncer_config import SyncerConfig
from atoll.errors import ConfigError

# Measured rates (see the module docstring for where each comes from): benchmarks/results/
# syncer_service/service.json, its "fit" and its 101M row (tests/unit/test_plan.py holds them to it)
NS_PER_VALUE = 8.05  # ns of syncer CPU per contributed value
PER_CONTRIBUTION_S = 21.85e-3  # CPU seconds per contribution, whatever its size
SNAPSHOT_NS_PER_BYTE = 0.277  # CPU ns per byte of a snapshot file (written past the page cache)
TAPE_BYTES_PER_VALUE = 8  # a tape record: the exact and public values, float32
PROCESS_BYTES = 0.45e9  # Python, torch, gRPC (BENCHMARKS.md s4: 273 MB idle) + numba: 136 MB
HISTORY = SyncerConfig.history  # public versions kept per fragment (64 today)
OUTER_BYTES = {"sgd": 0, "nesterov": 4, "delayed_nesterov": 8}
# Calibrated fixed costs on the wire (BENCHMARKS.md s7, benchmarks/wire_overhead.py)
WIRE_UP = {"framing": 1.099, "message_bytes": 463.0, "control_bps": 4032.0}
WIRE_DOWN = {"framing": 1.092, "message_bytes": 431.0, "control_bps": 2828.0}


def syncer_bytes_per_param(
    learners: int,
    history: int = HISTORY,
    outer: str = "sgd",
    snapshot: bool = True,
    fragments: int = 24,
    *,
    peak: str | None = None,
    **settings: int | str,
) -> float:
    """Bytes the syncer holds per parameter once warm, at its peak (during a snapshot with
    `snapshot`, else while closing a round; `peak="steady"`: between rounds): the syncer's own
    formula, `atoll.core.memory.memory_bytes` (history kept as broadcast int4 frames with
    periodic full copies, or frames only with `full_every=0`, docs/live.md "Syncer memory"),
    for a model large enough that fixed costs vanish. `settings`: memory_bytes's others
    (full_every, heal_codec, snapshot_history, ...)."""
    if outer not in OUTER_BYTES:
        raise ConfigError("outer", outer, ", ".join(OUTER_BYTES))
    n = fragments * (1 << 24)
    m = memory_bytes(n, fragments, learners, history=history, outer=outer, **settings)  # type: ignore[arg-type]
    return m[peak or ("snapshot_peak" if snapshot else "round_peak")] / n


@dataclass(frozen=True)
class PlanConfig:
    """The inputs of a plan. Defaults: P = H = 24, tau = 2, int4, 8 learners, 1 s steps."""

    params: float = 1e9
    step_s: float = 1.0
    fragments: int = 24
    H: int = 24
    tau: int = 2
    learners: int = 8
    link_gbps: float = 5.0  # each learner's (datacenter's) WAN link, per direction
    bits: float = 4.0  # bits per value on the wire (int4; --codec measures a codec's frames)
    bits_dp: float = 16.0  # data-parallel's gradients (bf16), for the speedup
    shards: int = 0  # 0: as many as the CPU needs; else this many
    outer: str = "sgd"
    history: int = HISTORY
    history_full_every: int = 16  # 0: the history as frames only (core/history.py)
    heal_codec: str = "int8"
    snapshot_history: int = 8
    max_core_load: float = 0.5
    snapshot_every_s: float = 10.0
    ns_per_value: float = NS_PER_VALUE
    host_cores: int = 64
    host_ram_gb: float = 512.0
    host_nic_gbps: float = 100.0

    def __post_init__(self) -> None:
        for name in ("params", "step_s", "link_gbps", "bits", "bits_dp", "snapshot_every_s",
                     "ns_per_value", "host_ram_gb", "host_nic_gbps"):  # fmt: skip
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ConfigError(name, value, "a positive number")
        for name in ("fragments", "H", "tau", "history", "host_cores"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(name, value, "a positive integer")
        if not isinstance(self.learners, int) or self.learners < 2:
            raise ConfigError("learners", self.learners, "an integer >= 2")
        if self.fragments > self.H:
            raise ConfigError("fragments", self.fragments, f"at most H={self.H}")
        if not isinstance(self.shards, int) or self.shards < 0:
            raise ConfigError("shards", self.shards, "a positive integer (0: as the CPU needs)")
        if self.shards > self.fragments:
            raise ConfigError("shards", self.shards, f"at most the fragments, P={self.fragments}")
        if not isinstance(self.history_full_every, int) or self.history_full_every < 0:
            raise ConfigError("history_full_every", self.history_full_every, "an integer >= 0")
        if not isinstance(self.snapshot_history, int) or self.snapshot_history < 2:
            raise ConfigError("snapshot_history", self.snapshot_history, "an integer >= 2")
        if self.heal_codec not in ("fp32", "bf16", "int8", "int4"):
            raise ConfigError("heal_codec", self.heal_codec, "fp32, bf16, int8, int4")
        if not 0 < self.max_core_load <= 1:
            raise ConfigError("max_core_load", self.max_core_load, "a fraction in (0, 1]")
        if self.outer not in OUTER_BYTES:
            raise ConfigError("outer", self.outer, ", ".join(OUTER_BYTES))
        if self.params < self.fragments:
            raise ConfigError("params", self.params, f"at least the fragments, P={self.fragments}")

    def bandwidth(self, **wire: float) -> BandwidthConfig:
        """The same setting as atoll.bandwidth sees it (one datacenter per learner)."""
        return BandwidthConfig(
            params=self.params, step_s=self.step_s, datacenters=self.learners, bits=self.bits,
            bits_dp=self.bits_dp, fragments=self.fragments, H=self.H, tau=self.tau, **wire,
        )  # fmt: skip


def contributions_per_s(c: PlanConfig) -> float:
    """Contributions the syncer takes in per second: M * P / (H * s)."""
    return c.learners * c.fragments / (c.H * c.step_s)


def cpu_per_contribution_s(c: PlanConfig) -> float:
    """Core-seconds one contribution of N / P values costs (measured rates)."""
    return PER_CONTRIBUTION_S + c.ns_per_value * 1e-9 * c.params / c.fragments


def tape_bytes_per_s(c: PlanConfig) -> float:
    """The tape's writes: a record per merge, (8 + outer) bytes per value of the fragment."""
    return (TAPE_BYTES_PER_VALUE + OUTER_BYTES[c.outer]) * c.params / (c.H * c.step_s)


def snapshot_cpu_s(c: PlanConfig, snapshot_history: int = 8) -> float:
    """Core-seconds one full snapshot costs (8 + 4 * snapshot_history bytes per parameter)."""
    return SNAPSHOT_NS_PER_BYTE * 1e-9 * (8 + 4 * snapshot_history) * c.params


def speedup(c: PlanConfig, link_gbps: float | None = None) -> dict[str, float]:
    """Compute utilisation of dp, synchronous DiLoCo and Decoupled on links of `link_gbps`
    (atoll.bandwidth.model.utilization), and Decoupled's speedup over each: the ratio of
    utilisations, i.e. of steps per second with the same chips and step time. Communication
    only: failures and stragglers (`atoll goodput`) are left out."""
    gbps = c.link_gbps if link_gbps is None else link_gbps
    if not gbps > 0:
        raise ConfigError("link_gbps", gbps, "a positive number")
    b = c.bandwidth()
    u = {m: utilization(m, b, gbps * 1e9) for m in ("dp", "diloco", "decoupled")}
    return {
        "link_gbps": gbps,
        "utilization": u,
        "over_dp": u["decoupled"] / u["dp"],
        "over_diloco": u["decoupled"] / u["diloco"],
    }


def plan(c: PlanConfig) -> dict:
    """The syncer's shards, cores, RAM and bandwidth for `c` (see the module docstring)."""
    load = contributions_per_s(c) * cpu_per_contribution_s(c)  # cores, snapshots aside
    need = max(1, math.ceil(load / c.max_core_load - 1e-9))
    shards = c.shards or need
    feasible = need <= c.fragments and (c.shards == 0 or c.shards >= need)
    mem = {"full_every": c.history_full_every, "heal_codec": c.heal_codec,
           "snapshot_history": c.snapshot_history}  # fmt: skip
    per_param = syncer_bytes_per_param(c.learners, c.history, c.outer, **mem)
    steady = syncer_bytes_per_param(c.learners, c.history, c.outer, peak="steady", **mem)
    ram = shards * PROCESS_BYTES + c.params * per_param
    up, down = c.bandwidth(**WIRE_UP), c.bandwidth(**WIRE_DOWN)
    learner_up, learner_down = average_rate("decoupled", up), average_rate("decoupled", down)
    snap = snapshot_cpu_s(c, c.snapshot_history)
    cores = 2 * shards
    hosts = max(
        math.ceil(cores / c.host_cores),
        math.ceil(ram / (c.host_ram_gb * 1e9)),
        math.ceil(c.learners * max(learner_up, learner_down) / (c.host_nic_gbps * 1e9)),
    )
    return {
        "config": asdict(c),
        "contributions_per_s": contributions_per_s(c),
        "cpu_per_contribution_s": cpu_per_contribution_s(c),
        "cpu_cores_load": load,
        "shards_needed": need,
        "shards": shards,
        "feasible": feasible,
        "load_per_shard": load / shards,
        "cores": cores,
        "bytes_per_param": per_param,  # at the snapshot peak
        "steady_bytes_per_param": steady,  # between rounds and snapshots
        "ram_bytes": ram,
        "ram_per_shard_bytes": ram / shards,
        "snapshot_cpu_s": snap,
        "snapshot_every_s_min": 10 * snap / shards,  # snapshots at <= 10% of each shard's core
        "snapshot_load_per_shard": snap / shards / c.snapshot_every_s,
        "tape_bytes_per_s": tape_bytes_per_s(c),
        "snapshot_bytes_per_s": (8 + 4 * c.snapshot_history) * c.params / c.snapshot_every_s,
        "learner_required_gbps": required_bandwidth("decoupled", c.bandwidth()) / 1e9,
        "learner_up_gbps": learner_up / 1e9,
        "learner_down_gbps": learner_down / 1e9,
        "syncer_in_gbps": c.learners * learner_up / 1e9,
        "syncer_out_gbps": c.learners * learner_down / 1e9,
        "hosts": hosts,
        "speedup": speedup(c),
    }


PAPER = {"params": 12e9, "learners": 4, "links_gbps": (2.0, 5.0), "claim": ">20x"}


def paper_setting(c: PlanConfig) -> list[dict]:
    """The paper's setting (12B parameters, 4 regions, 2-5 Gbps) with `c`'s other settings
    (step time, P, H, tau, bits): Decoupled's predicted speedup at each end of the range."""
    p = replace(c, params=PAPER["params"], learners=PAPER["learners"], shards=0)
    return [speedup(p, g) for g in PAPER["links_gbps"]]
