"""What every simulated method shares: model and data, evaluation, the inner optimizer,
simulated step times, the failure schedule and links. Same seed -> same world for every method."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from atoll.model import GPT, ByteCorpus, GPTConfig, load_stdlib_corpus
from atoll.model.data import load_text_files
from atoll.sim.config import SimConfig

_CORPUS_CACHE: dict[tuple[str, int], ByteCorpus] = {}


def corpus_for(cfg: SimConfig) -> ByteCorpus:
    key = (cfg.data, cfg.data_bytes)
    if key not in _CORPUS_CACHE:
        if cfg.data == "stdlib":
            raw = load_stdlib_corpus(cfg.data_bytes)
        else:
            raw = load_text_files([p for p in cfg.data.split(",") if p], cfg.data_bytes)
        _CORPUS_CACHE[key] = ByteCorpus(raw)
    return _CORPUS_CACHE[key]


def gpt_config(cfg: SimConfig) -> GPTConfig:
    return GPTConfig(
        context=cfg.context, n_layer=cfg.n_layer, n_head=cfg.n_head, d_model=cfg.d_model
    )


def new_model(cfg: SimConfig) -> GPT:
    """The shared initialisation (seeded): every method and learner starts from it."""
    torch.manual_seed(cfg.seed)
    return GPT(gpt_config(cfg))


def new_inner_optimizer(model: torch.nn.Module, cfg: SimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
    )


def inner_lr(cfg: SimConfig, step: int) -> float:
    """Linear warmup, then cosine from lr to lr/10 over `steps` (held at lr/10 after)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = min((step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1), 1.0)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train_step(model: GPT, opt: torch.optim.Optimizer, batch: tuple, lr: float) -> float:
    for g in opt.param_groups:
        g["lr"] = lr
    x, y = batch
    loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


class Evaluator:
    """Mean cross-entropy (nats/byte) of a parameter set on fixed held-out batches."""

    def __init__(self, cfg: SimConfig, corpus: ByteCorpus) -> None:
        self.model = GPT(gpt_config(cfg))
        self.batches = corpus.eval_batches(cfg.eval_batches, cfg.batch, cfg.context, seed=1234)

    @torch.no_grad()
    def __call__(self, params: dict[str, torch.Tensor]) -> float:
        self.model.load_state_dict(params, strict=True)
        self.model.eval()
        return sum(float(self.model(x, y)) for x, y in self.batches) / len(self.batches)


class DataStream:
    """Learner i's batches: random windows of shard i of M, from its own seeded generator.

    A window may straddle two of the shard's blocks (about 1.6% of windows with 4 KiB blocks
    and 65-byte windows) and join two unrelated stretches of text, as file boundaries do anyway.
    """

    def __init__(self, cfg: SimConfig, corpus: ByteCorpus, index: int) -> None:
        self.source = corpus.shard(index, cfg.learners, cfg.shard_block)
        self.gen = torch.Generator().manual_seed(cfg.seed * 1000 + index)
        self.batch, self.context = cfg.batch, cfg.context

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        return ByteCorpus.batch(self.source, self.batch, self.context, self.gen)


class StepClock:
    """Simulated step time of learner i: step_time_s * speed factor * (1 + noise*N(0,1))."""

    def __init__(self, cfg: SimConfig, index: int) -> None:
        self.base = cfg.step_time_s * cfg.speed_factors()[index]
        self.noise = cfg.speed_noise
        self.rng = random.Random(f"{cfg.seed}-clock-{index}")

    def draw(self) -> float:
        if self.noise == 0:
            return self.base
        return self.base * max(0.2, 1.0 + self.noise * self.rng.gauss(0.0, 1.0))


class FailureSchedule:
    """Per-learner Poisson failures (mean time between failures `mtbf_s`, counted from the
    end of the previous recovery) and downtimes of downtime_s * U(1-j, 1+j). The sequence of
    learner i depends only on the seed and i, so every method meets the same failures."""

    def __init__(self, cfg: SimConfig, index: int) -> None:
        self.mtbf, self.down, self.jitter = cfg.mtbf_s, cfg.downtime_s, cfg.downtime_jitter
        self.rng = random.Random(f"{cfg.seed}-failures-{index}")
        self.t = 0.0

    def next(self) -> tuple[float, float] | None:
        """(fail_at, recovered_at) of the next failure, or None without failures."""
        if self.mtbf <= 0:
            return None
        fail = self.t + self.rng.expovariate(1.0 / self.mtbf)
        down = self.down * self.rng.uniform(1 - self.jitter, 1 + self.jitter)
        self.t = fail + down
        return fail, fail + down


@dataclass
class Link:
    """One direction of a learner's link: FIFO, `bandwidth` bits/s, fixed latency."""

    bandwidth_bps: float
    latency_s: float
    busy_until: float = 0.0
    bytes_sent: int = 0

    def transfer(self, now: float, nbytes: int) -> float:
        """Queue `nbytes` at `now`; returns the arrival time."""
        start = max(now, self.busy_until)
        self.busy_until = start + 8.0 * nbytes / self.bandwidth_bps
        self.bytes_sent += nbytes
        return self.busy_until + self.latency_s

    def reset(self, now: float) -> None:
        """The endpoint died: whatever was queued is dropped."""
        self.busy_until = now


class EvalPoints:
    """Held-out evaluations at fractions k/n of the token budget, k = 1..n."""

    def __init__(self, budget: int, n: int) -> None:
        self.budget, self.n, self.next = budget, n, 1

    def due(self, tokens: int) -> int:
        """How many points `tokens` has reached since the last call (one step can pass
        several; the caller evaluates once and records that many points)."""
        passed = 0
        while self.next <= self.n and tokens >= self.budget * self.next / self.n:
            self.next += 1
            passed += 1
        return passed


def dp_equivalent_bytes(cfg: SimConfig, tokens: int, model_bytes: int) -> int:
    """Bytes a data-parallel ring all-reduce of fp32 gradients sends for `tokens` tokens."""
    dp_steps = tokens / (cfg.learners * cfg.batch * cfg.context)
    return int(dp_steps * cfg.learners * ring_allreduce_bytes(model_bytes, cfg.learners))


def ring_allreduce_bytes(nbytes: int, workers: int) -> int:
    """Bytes each worker sends in a ring all-reduce of an `nbytes` buffer."""
    return 0 if workers <= 1 else int(2 * (workers - 1) / workers * nbytes)


def ring_allreduce_time(nbytes: int, workers: int, bandwidth_bps: float, latency_s: float) -> float:
    if workers <= 1:
        return 0.0
    return (
        8.0 * ring_allreduce_bytes(nbytes, workers) / bandwidth_bps + 2 * (workers - 1) * latency_s
    )


@dataclass
class RunResult:
    """What one simulated method run reports (see README for every key)."""

    name: str
    method: str
    eval_loss: float = float("nan")
    tokens: int = 0
    wall_time_s: float = 0.0
    goodput: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    bytes_heal: int = 0  # part of bytes_down: full fp32 models sent to (re)joining learners
    dp_bytes: int = 0
    rounds: int = 0
    participants_mean: float = 0.0
    participants_hist: dict[str, int] = field(default_factory=dict)
    staleness_mean: float = 0.0
    staleness_max: int = 0
    blocked_s: float = 0.0
    down_s: float = 0.0
    lost_work_s: float = 0.0
    failures: int = 0
    curve: list[dict[str, float]] = field(default_factory=list)
    settings: dict[str, object] = field(default_factory=dict)


ProgressFn = Callable[[int, int], None]
