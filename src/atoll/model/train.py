"""Training the built-in model: the inner optimizer and its schedule, one step, each learner's
data stream and the held-out evaluation. Shared by the simulator and the live learner."""

from __future__ import annotations

import math

import torch

from atoll.config import SimConfig
from atoll.model.adamw import AdamW
from atoll.model.data import TokenCorpus
from atoll.model.gpt import GPT
from atoll.model.recipe import new_model


def new_inner_optimizer(model: torch.nn.Module, cfg: SimConfig) -> AdamW:
    """torch's AdamW, bit for bit, without its 2 CPU seconds of imports (model/adamw.py)."""
    return AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)


def inner_lr(cfg: SimConfig, step: int) -> float:
    """Linear warmup, then cosine from lr to lr/10 over `steps` (held at lr/10 after)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = min((step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1), 1.0)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train_step(model: GPT, opt: AdamW, batch: tuple, lr: float) -> float:
    for g in opt.param_groups:
        g["lr"] = lr
    x, y = batch
    loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


class Evaluator:
    """Mean cross-entropy (nats per token; per byte for text) of a parameter set on fixed
    held-out batches."""

    def __init__(self, cfg: SimConfig, corpus: TokenCorpus) -> None:
        self.model = new_model(cfg)  # its values are replaced by each call's
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

    def __init__(self, cfg: SimConfig, corpus: TokenCorpus, index: int) -> None:
        self.source = corpus.shard(index, cfg.learners, cfg.shard_block)
        self.gen = torch.Generator().manual_seed(cfg.seed * 1000 + index)
        self.batch, self.context = cfg.batch, cfg.context

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        return TokenCorpus.batch(self.source, self.batch, self.context, self.gen)
