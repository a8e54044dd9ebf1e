"""The sections of a job's settings (`atoll.config.job.JobConfig`: run, model, protocol,
world, and live in live.py), each a frozen dataclass with its own `validate`.

- RunSettings       which method, seed, how many learners, how long, torch threads
- ModelSettings     the built-in model, its data, evaluation and inner optimizer
- ProtocolSettings  fragments, schedule, syncer, outer optimizer, wire codecs, receipt; the one
                    conversion to the core's LearnerConfig / SyncerConfig
- WorldSettings     the simulated world: step times, links, failures

`SimConfig` is all four in one flat frozen dataclass (by inheritance, fields in the order
above), so `cfg.learners`, `cfg.P` and `dataclasses.asdict(cfg)` see every key: the flat
view the drivers use, `JobConfig.sim`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from atoll.errors import ConfigError

if TYPE_CHECKING:
    from atoll.core.learner import LearnerConfig
    from atoll.core.syncer import SyncerConfig

METHODS = ("data_parallel", "sync_diloco", "decoupled")
DATA_DTYPES = ("uint16", "uint32")  # how a token file (data=...bin) stores its ids


def need(cfg: object, ok: bool, key: str, allowed: str) -> None:
    """Raise ConfigError naming `key`, its value on `cfg` and what is allowed, unless `ok`."""
    if not ok:
        raise ConfigError(key, getattr(cfg, key), allowed)


MAX_LEARNERS = 4096  # learners of one run (per-learner settings are lists this long)


@dataclass(frozen=True)
class RunSettings:
    method: str = "decoupled"
    seed: int = 0
    learners: int = 4  # M
    steps: int = 150  # inner steps per learner; token budget = learners*steps*batch*context
    threads: int = 1  # torch threads (the math is identical for a given value)
    # tokens the run trains, every learner's together (the syncer ends the run there); 0: the
    # built-in model's learners*steps*batch*context. A custom model's tokens per step are its
    # own: set its budget here
    token_budget: int = 0

    def validate(self) -> RunSettings:
        need(self, self.method in METHODS, "method", f"one of {METHODS}")
        need(
            self,
            1 <= self.learners <= MAX_LEARNERS,
            "learners",
            f"an integer in [1, {MAX_LEARNERS}]",
        )
        need(self, self.steps >= 1, "steps", "an integer >= 1")
        need(self, self.threads >= 1, "threads", "an integer >= 1")
        need(
            self,
            self.token_budget >= 0,
            "token_budget",
            "an integer >= 0: tokens the run trains, every learner's together (0: learners x "
            "steps x batch x context, the built-in model's)",
        )
        return self


@dataclass(frozen=True)
class ModelSettings:
    # model and data
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 4
    context: int = 64
    batch: int = 16
    # what the model trains on (atoll.model.data): "stdlib" (the Python standard library's
    # sources), text files (comma separated; each byte a token), or one token file ending in
    # .bin: a flat array of token ids as nanoGPT's prepare scripts write, memory-mapped
    data: str = "stdlib"
    data_bytes: int = 4_000_000  # text: the first this many bytes are read; token files: all
    data_dtype: str = "uint16"  # how a .bin file stores its ids: uint16, or uint32 (vocab > 65536)
    # the held-out split (what eval_loss measures): the last int(n * eval_fraction) tokens of
    # data, at least one (n: the token file's ids; text: the bytes read, at most data_bytes),
    # the train split being everything before them; or, with eval_data (files of the same kind
    # as data, e.g. nanoGPT's val.bin), those files, and all of data trains
    eval_fraction: float = 0.1
    eval_data: str = ""
    vocab: int = 256  # the model's vocabulary: every token id must be < vocab (text: 256)
    shard_block: int = 4096  # tokens per block dealt round robin to learners; 0 = contiguous
    eval_batches: int = 8
    eval_points: int = 8
    # inner optimizer (AdamW, linear warmup then cosine to 10% over `steps`)
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.0

    def validate(self) -> ModelSettings:
        sizes = ("n_layer", "d_model", "n_head", "context", "batch", "eval_batches", "eval_points")
        for k in sizes:
            need(self, getattr(self, k) >= 1, k, "an integer >= 1")
        need(
            self,
            self.d_model % self.n_head == 0,
            "d_model",
            f"a multiple of n_head={self.n_head}",
        )
        need(self, self.lr > 0, "lr", "a number > 0")
        need(self, self.shard_block >= 0, "shard_block", "an integer >= 0 (0 = contiguous shards)")
        need(self, self.warmup >= 0, "warmup", "an integer >= 0")
        self._validate_data()
        return self

    def _validate_data(self) -> None:
        """The data settings, as written (the files themselves are checked when the corpus is
        read: atoll.model.recipe.load_corpus)."""
        tokens = [p.strip().endswith(".bin") for p in self.data.split(",") if p.strip()]
        need(
            self,
            bool(tokens) and (all(tokens) and len(tokens) == 1 or not any(tokens)),
            "data",
            '"stdlib", text files (comma separated), or one token file ending in .bin',
        )
        need(self, self.data_bytes >= 1, "data_bytes", "an integer >= 1")
        need(self, self.data_dtype in DATA_DTYPES, "data_dtype", f"one of {', '.join(DATA_DTYPES)}")
        need(self, 0 < self.eval_fraction < 1, "eval_fraction", "a number in (0, 1)")
        need(self, self.vocab >= 2, "vocab", "an integer >= 2")
        if tokens[0]:
            need(
                self,
                self.data_dtype == "uint32" or self.vocab <= 2**16,
                "data_dtype",
                f"uint32 for vocab={self.vocab} (a uint16 file holds ids up to 65535 only)",
            )
        if self.eval_data:
            kind = "one token file ending in .bin" if tokens[0] else "text files (none .bin)"
            ends = [p.strip().endswith(".bin") for p in self.eval_data.split(",") if p.strip()]
            need(
                self,
                bool(ends) and (all(ends) and len(ends) == 1 if tokens[0] else not any(ends)),
                "eval_data",
                f'"" (the last eval_fraction of data), or {kind}, as data is',
            )


@dataclass(frozen=True)
class ProtocolSettings:
    # fragments and schedule
    P: int = 24
    H: int = 24
    tau: int = 2
    packing: str = "balanced"
    schedule: str = "pull"  # "pull": the syncer paces rounds; "push": each learner's step count
    # syncer
    quorum: int = 1  # K
    grace: bool = True
    grace_gamma: float = 0.5
    grace_ema: float = 0.1
    merge: str = "rda"
    weighting: str = "tokens"
    light_rounds: str = "scale"  # a round of little weight moves Theta less (core/merge.py)
    # magnitude guard (atoll.core.guard): a contribution beyond `guard` x what the run has
    # seen is refused and its learner heals; 0 = off
    guard: float = 10.0
    # the syncer's public versions kept per fragment to resolve learners' bases (older ones as
    # the int4 frames broadcast, a full one every `history_full_every`, 0: none, resolved
    # backward from the newest to float32 rounding, core/history.py); `history_bytes` > 0
    # bounds them in bytes (a base beyond is refused, its learner heals; docs/live.md)
    history: int = 64
    history_full_every: int = 16
    history_bytes: int = 0
    # the syncer round's data path (atoll.core.fused): "auto" (numba kernels for fragments of
    # 256K values and up), "on", "off" (torch); its threads ("auto": the process's cores)
    fused: str = "auto"
    syncer_threads: str = "auto"
    # outer optimizer: plain SGD with lr 1 (the merged value itself) measured best at this
    # scale; Nesterov (0.7, 0.9) lost 0.3-0.4 nats (benchmarks/results/outer_sweep.json)
    outer: str = "sgd"
    outer_lr: float = 1.0
    outer_momentum: float = 0.9
    outer_delay: int = 4
    # wire
    codec: str = "int4"
    down_codec: str = "int4"
    # a fragment sent whole (a heal; a slow link's queue that outgrew the fragment): int8 is
    # a quarter of fp32, |error| <= absmax/254 per group, in the learner's copy only
    heal_codec: str = "int8"
    group: int = 64
    error_feedback: bool = True
    sync_codec: str = "fp32"  # outer-gradient all-reduce of synchronous DiLoCo
    # learner receipt
    receipt: str = "overwrite"
    alpha: float = 0.5
    block: bool = True

    def validate(self, learners: int | None = None) -> ProtocolSettings:
        """`learners` (M), when known, bounds the quorum: K <= M."""
        need(self, self.group >= 1, "group", "an integer >= 1")
        need(self, self.guard == 0 or 1 < self.guard < math.inf, "guard", "0 (off) or a number > 1")
        need(self, self.H >= 1, "H", "an integer >= 1")
        need(self, self.history >= 2, "history", "an integer >= 2")
        need(
            self,
            self.history_full_every >= 0,
            "history_full_every",
            "an integer >= 0 (0: frames only)",
        )
        need(self, self.history_bytes >= 0, "history_bytes", "0 (no bound) or bytes > 0")
        from atoll.core.choices import check_choices, check_fused

        check_choices(self)  # packing, schedule, merge, weighting, outer, receipt, codecs...
        check_fused(self.fused, self.syncer_threads)  # the round's data path and its threads
        need(self, 0 <= self.alpha < 1, "alpha", "a number in [0, 1)")
        need(self, 1 <= self.P <= self.H, "P", f"an integer in [1, H={self.H}]")
        need(self, 0 <= self.tau < self.H, "tau", f"an integer in [0, H={self.H})")
        if learners is None:
            need(self, self.quorum >= 1, "quorum", "an integer >= 1")
        else:
            need(
                self,
                1 <= self.quorum <= learners,
                "quorum",
                f"an integer in [1, learners={learners}] (K <= M)",
            )
        return self

    def learner_config(self) -> LearnerConfig:
        """The core learner state machine's settings, field by field (tests/test_config.py
        checks that every field of LearnerConfig is set here)."""
        from atoll.core.learner import LearnerConfig

        return LearnerConfig(
            tau=self.tau,
            codec=self.codec,
            group=self.group,
            error_feedback=self.error_feedback,
            receipt=self.receipt,
            alpha=self.alpha,
            block=self.block,
            schedule=self.schedule,
        )

    def syncer_config(self) -> SyncerConfig:
        """The core syncer state machine's settings, field by field."""
        from atoll.core.syncer import SyncerConfig

        return SyncerConfig(
            quorum=self.quorum,
            tau=self.tau,
            grace=self.grace,
            grace_gamma=self.grace_gamma,
            grace_ema=self.grace_ema,
            merge=self.merge,
            weighting=self.weighting,
            light_rounds=self.light_rounds,
            outer=self.outer,
            outer_lr=self.outer_lr,
            outer_momentum=self.outer_momentum,
            outer_delay=self.outer_delay,
            down_codec=self.down_codec,
            heal_codec=self.heal_codec,
            group=self.group,
            schedule=self.schedule,
            codec=self.codec,
            guard=self.guard,
            history=self.history,
            history_full_every=self.history_full_every,
            history_bytes=self.history_bytes,
            fused=self.fused,
            syncer_threads=self.syncer_threads,
        )


@dataclass(frozen=True)
class WorldSettings:
    # simulated hardware
    step_time_s: float = 1.0
    speeds: str = "1"  # step-time factor per learner, comma separated (one value: all)
    speed_noise: float = 0.0  # relative std of each step's time
    bandwidth_mbps: float = 1000.0  # per learner link, each direction
    latency_ms: float = 20.0
    # failures (per learner Poisson; 0 = none)
    mtbf_s: float = 0.0
    downtime_s: float = 30.0
    downtime_jitter: float = 0.5
    # chaos (atoll.chaos): a scenario file (.toml/.json) or spec ("kill:L1@20+3,stop:L2@30+2",
    # missing durations: downtime_s), applied in virtual seconds; "" = none
    scenario: str = ""

    def speeds_for(self, learners: int) -> list[float]:
        """One step-time factor per learner, from `speeds`."""
        try:
            vals = [float(x) for x in str(self.speeds).split(",") if x.strip()]
        except ValueError:
            raise ConfigError("speeds", self.speeds, "comma-separated numbers > 0") from None
        if len(vals) == 1:
            vals = vals * learners
        if len(vals) != learners or not all(0 < v < math.inf for v in vals):
            raise ConfigError(
                "speeds",
                self.speeds,
                f"one finite number > 0, or {learners} of them (one per learner)",
            )
        return vals

    def validate(self, learners: int | None = None) -> WorldSettings:
        """`learners`, when known, is the number of `speeds` factors expected."""
        need(self, self.step_time_s > 0, "step_time_s", "a number > 0")
        need(self, self.speed_noise >= 0, "speed_noise", "a number >= 0")
        need(
            self,
            self.bandwidth_mbps > 0,
            "bandwidth_mbps",
            "a number > 0 (megabits per second)",
        )
        need(self, self.latency_ms >= 0, "latency_ms", "a number >= 0")
        need(self, self.mtbf_s >= 0, "mtbf_s", "a number >= 0 (0 = no failures)")
        need(self, self.downtime_s >= 0, "downtime_s", "a number >= 0")
        need(self, 0 <= self.downtime_jitter < 1, "downtime_jitter", "a number in [0, 1)")
        if learners is not None:
            self.speeds_for(learners)
        if self.scenario and learners is not None:
            from atoll.chaos import load

            load(self.scenario, self.downtime_s).validate(learners)
        return self


@dataclass(frozen=True)
class SimConfig(WorldSettings, ProtocolSettings, ModelSettings, RunSettings):
    """Every setting of a run (simulated, or the model/protocol half of a live one)."""

    def speed_factors(self) -> list[float]:
        return self.speeds_for(self.learners)

    def budget_tokens(self) -> int:
        """The run's token budget: `token_budget` when set (> 0), else the built-in model's
        learners x steps x batch x context."""
        if self.token_budget > 0:
            return self.token_budget
        return self.learners * self.steps * self.batch * self.context

    def validate(self) -> SimConfig:
        RunSettings.validate(self)
        ModelSettings.validate(self)
        ProtocolSettings.validate(self, self.learners)
        WorldSettings.validate(self, self.learners)
        return self
