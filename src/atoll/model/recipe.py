"""The built-in model from the settings: its seeded initialisation, its corpus, and its fragment
plan (a custom model's starting point is atoll.model.custom's).

No hidden global state: `new_model` seeds its own fork of torch's CPU generator (the caller's
global RNG is untouched), and corpora are cached only in a `CorpusCache` the caller owns.
"""

from __future__ import annotations

import torch

from atoll.config import SimConfig
from atoll.core.fragments import FragmentPlan, make_plan
from atoll.errors import ConfigError
from atoll.model.data import ByteCorpus, TokenCorpus, is_token_data, load_corpus_bytes
from atoll.model.gpt import GPT, GPTConfig


def gpt_config(cfg: SimConfig) -> GPTConfig:
    return GPTConfig(
        vocab_size=cfg.vocab,
        context=cfg.context,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        d_model=cfg.d_model,
    )


def new_model(cfg: SimConfig) -> GPT:
    """The shared initialisation (seeded by cfg.seed): every method and learner starts from it.

    Built under a fork of torch's CPU generator seeded with cfg.seed: the values are those of
    `torch.manual_seed(cfg.seed); GPT(...)`, and the caller's generator state is as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(cfg.seed)
        return GPT(gpt_config(cfg))


def corpus_bytes(cfg: SimConfig) -> bytes:
    """The raw text of the settings (`data`, `data_bytes`; not for token files)."""
    return load_corpus_bytes(cfg.data, cfg.data_bytes)


def load_corpus(cfg: SimConfig, text: bytes | None = None) -> TokenCorpus:
    """The corpus of the settings, read now (see CorpusCache to read it once for many runs)
    and checked (`check_corpus`). `text`: `data`'s bytes already read (`corpus_bytes`; the
    launcher reads them once for all its learners); token files are memory-mapped."""
    if is_token_data(cfg.data):
        corpus: TokenCorpus = TokenCorpus.from_file(
            cfg.data, cfg.data_dtype, cfg.eval_fraction, cfg.eval_data
        )
    else:
        text = text if text is not None else corpus_bytes(cfg)
        held = None
        if cfg.eval_data:
            held = load_corpus_bytes(cfg.eval_data, cfg.data_bytes, "eval_data")
        corpus = ByteCorpus(text, cfg.eval_fraction, held)
    check_corpus(corpus, cfg)
    return corpus


def check_data(cfg: SimConfig) -> bytes | None:
    """Read and check the corpus of the settings before anything starts (a ConfigError if it
    cannot be used); its text, for learners to load instead of the files, or None for a
    token file (each learner maps the file itself)."""
    text = None if is_token_data(cfg.data) else corpus_bytes(cfg)
    load_corpus(cfg, text)
    return text


def check_corpus(corpus: TokenCorpus, cfg: SimConfig) -> None:
    """A ConfigError unless the model's vocabulary holds every token id and every learner's
    shard and the held-out split hold one window of context+1 tokens (and one to start it)."""
    top = corpus.max_id()
    if top >= cfg.vocab:
        where = f"data={cfg.data!r}" + (
            f" and eval_data={cfg.eval_data!r}" if cfg.eval_data else ""
        )
        allowed = f"an integer > every token id of {where}: the largest is {top}, so >= {top + 1}"
        if is_token_data(cfg.data):
            allowed += f" (or data_dtype={cfg.data_dtype} is not how the file stores its ids)"
        raise ConfigError("vocab", cfg.vocab, allowed)
    need = cfg.context + 2  # a window of context+1 tokens, and one start to draw
    unit = "tokens" if is_token_data(cfg.data) else "bytes"
    for i in range(cfg.learners):
        got = len(corpus.shard(i, cfg.learners, cfg.shard_block))
        if got < need:
            allowed = (
                f"a corpus whose train split gives each of the learners={cfg.learners} at least "
                f"context+2={need} {unit} (learner {i} gets {got}: blocks of "
                f"shard_block={cfg.shard_block} dealt round robin, the train split has "
                f"{len(corpus.train)}): more data, fewer learners or a smaller shard_block"
            )
            raise ConfigError("data", cfg.data, allowed)
    if len(corpus.eval) < need:
        if cfg.eval_data:
            key, value, split = "eval_data", cfg.eval_data, "it"
        else:
            key, value = "data", cfg.data
            split = f"the held-out split (the last eval_fraction={cfg.eval_fraction})"
        allowed = (
            f"a corpus whose held-out split has at least context+2={need} {unit} "
            f"({split} has {len(corpus.eval)})"
        )
        raise ConfigError(key, value, allowed)


class CorpusCache:
    """Corpora by their settings, so that the runs of one preset read the files once."""

    def __init__(self) -> None:
        self._corpora: dict[tuple, TokenCorpus] = {}

    def get(self, cfg: SimConfig) -> TokenCorpus:
        """The corpus of `cfg` (checked against `cfg`'s model, learners and context)."""
        key = (cfg.data, cfg.data_bytes, cfg.data_dtype, cfg.eval_fraction, cfg.eval_data)
        if key not in self._corpora:
            self._corpora[key] = load_corpus(cfg)
        else:
            check_corpus(self._corpora[key], cfg)
        return self._corpora[key]


def builtin_plan(cfg: SimConfig) -> tuple[FragmentPlan, list[torch.Tensor]]:
    """The built-in model's fragment plan and its seeded initial fragment values."""
    model = new_model(cfg)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    plan = make_plan(shapes, cfg.P, cfg.H, model.embedding_names(), cfg.packing)
    params = dict(model.named_parameters())
    return plan, [plan.flatten(params, p) for p in range(plan.P)]
