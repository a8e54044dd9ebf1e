"""The built-in model from the settings: its seeded initialisation, its corpus, and its fragment
plan (a custom model's starting point is atoll.model.custom's).

No hidden global state: `new_model` seeds its own fork of torch's CPU generator (the caller's
global RNG is untouched), and corpora are cached only in a `CorpusCache` the caller owns.
"""

from __future__ import annotations

import torch

from atoll.config import SimConfig
from atoll.core.fragments import FragmentPlan, make_plan
from atoll.model.data import ByteCorpus, load_corpus_bytes
from atoll.model.gpt import GPT, GPTConfig


def gpt_config(cfg: SimConfig) -> GPTConfig:
    return GPTConfig(
        context=cfg.context, n_layer=cfg.n_layer, n_head=cfg.n_head, d_model=cfg.d_model
    )


def new_model(cfg: SimConfig) -> GPT:
    """The shared initialisation (seeded by cfg.seed): every method and learner starts from it.

    Built under a fork of torch's CPU generator seeded with cfg.seed: the values are those of
    `torch.manual_seed(cfg.seed); GPT(...)`, and the caller's generator state is as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(cfg.seed)
        return GPT(gpt_config(cfg))


def corpus_bytes(cfg: SimConfig) -> bytes:
    """The raw corpus of the settings (`data`, `data_bytes`)."""
    return load_corpus_bytes(cfg.data, cfg.data_bytes)


def load_corpus(cfg: SimConfig) -> ByteCorpus:
    """The corpus of the settings, read now (see CorpusCache to read it once for many runs)."""
    return ByteCorpus(corpus_bytes(cfg))


class CorpusCache:
    """Corpora by (data, data_bytes), so that the runs of one preset read the files once."""

    def __init__(self) -> None:
        self._corpora: dict[tuple[str, int], ByteCorpus] = {}

    def get(self, cfg: SimConfig) -> ByteCorpus:
        key = (cfg.data, cfg.data_bytes)
        if key not in self._corpora:
            self._corpora[key] = load_corpus(cfg)
        return self._corpora[key]


def builtin_plan(cfg: SimConfig) -> tuple[FragmentPlan, list[torch.Tensor]]:
    """The built-in model's fragment plan and its seeded initial fragment values."""
    model = new_model(cfg)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    plan = make_plan(shapes, cfg.P, cfg.H, model.embedding_names(), cfg.packing)
    params = dict(model.named_parameters())
    return plan, [plan.flatten(params, p) for p in range(plan.P)]
