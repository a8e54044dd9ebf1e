"""The peer benchmark's workload: what a user brings, the same for every system.

A byte-level GPT of about 0.9M parameters in 53 tensors (defined here, not atoll's built-in
model), a text corpus (the Python standard library's top-level modules, read from this
machine: no download), AdamW with warmup and cosine decay, and the training loop's pieces that
both systems' learner scripts share: seeded batches per learner, a progress file per learner
(its step count survives a restart, as a user's checkpoint of its counters would), an optional
slowdown (a straggler sleeps after each step for (factor - 1) times its compute time: it frees
the CPU rather than burning it) and the offline evaluator of saved global models.
"""

from __future__ import annotations

import json
import math
import os
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class Work:
    steps: int = 300  # inner steps per learner (the token budget: learners * steps * batch * ctx)
    learners: int = 4
    batch: int = 16
    context: int = 128  # 16 * 128 = 2,048 tokens per step
    d_model: int = 128
    layers: int = 4
    heads: int = 4
    lr: float = 3e-3
    warmup: int = 20
    min_lr_frac: float = 0.1
    weight_decay: float = 0.1
    seed: int = 0
    eval_batches: int = 16

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.context

    @property
    def token_budget(self) -> int:
        return self.learners * self.steps * self.tokens_per_step

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> Work:
        return Work(**json.loads(text))


# -- the model ----------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class ByteGPT(nn.Module):
    """256 byte tokens in, next-byte logits out: 4 + 12 per layer + 1 tensors."""

    def __init__(self, w: Work) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, w.d_model)
        self.pos = nn.Embedding(w.context, w.d_model)
        self.blocks = nn.ModuleList(Block(w.d_model, w.heads) for _ in range(w.layers))
        self.ln = nn.LayerNorm(w.d_model)
        self.head = nn.Linear(w.d_model, 256, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def build_model(w: Work) -> ByteGPT:
    torch.manual_seed(w.seed)
    return ByteGPT(w)


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))


def inner_optimizer(model: nn.Module, w: Work) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(), lr=w.lr, betas=(0.9, 0.95), weight_decay=w.weight_decay
    )


def lr_at(step: int, w: Work) -> float:
    """Linear warmup, then cosine decay to min_lr_frac over the learner's steps."""
    if step < w.warmup:
        return w.lr * (step + 1) / w.warmup
    t = min((step - w.warmup) / max(w.steps - w.warmup, 1), 1.0)
    return w.lr * (w.min_lr_frac + (1 - w.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


# -- the corpus and batches ---------------------------------------------------------------------
def corpus() -> tuple[torch.Tensor, torch.Tensor]:
    """(train, eval) bytes: the standard library's top-level modules in name order; the last
    5% of the bytes are held out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    data = b"".join(p.read_bytes() for p in sorted(root.glob("*.py")))
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    cut = int(len(t) * 0.95)
    return t[:cut], t[cut:]


class Batches:
    """Random windows of the training bytes, seeded by (seed, learner, step): a restarted
    learner draws what it would have drawn."""

    def __init__(self, train: torch.Tensor, w: Work, learner: int) -> None:
        self.train, self.w, self.learner = train, w, learner

    def at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(hash((self.w.seed, self.learner, step)) % 2**62)
        i = torch.randint(len(self.train) - self.w.context - 1, (self.w.batch,), generator=g)
        win = torch.stack([self.train[j : j + self.w.context + 1] for j in i.tolist()])
        return win[:, :-1], win[:, 1:]


@torch.no_grad()
def evaluate(model: nn.Module, held: torch.Tensor, w: Work) -> float:
    """Mean loss (nats/byte) on fixed windows of the held-out bytes."""
    model.eval()
    n = w.eval_batches * w.batch
    stride = max((len(held) - w.context - 1) // n, 1)
    starts = [k * stride for k in range(n)]
    total = 0.0
    for b in range(w.eval_batches):
        win = torch.stack([held[j : j + w.context + 1] for j in starts[b * w.batch :][: w.batch]])
        total += float(loss_of(model, win[:, :-1], win[:, 1:]))
    model.train()
    return total / w.eval_batches


# -- the loop's bookkeeping ---------------------------------------------------------------------
class Progress:
    """A learner's step count and tokens, one JSON line per step in `path` (the harness reads
    tokens over time from these; a restarted learner continues from the last line)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step, self.tokens = 0, 0
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    d = json.loads(line)
                except ValueError:
                    continue  # a line torn by a SIGKILL
                if "step" in d:
                    self.step, self.tokens = d["step"], d["tokens"]
        self.f = open(path, "a")

    def record(self, tokens: int, loss: float, compute_s: float = 0.0) -> None:
        """One step done: `compute_s` its forward, backward and optimizer seconds (a
        straggler's sleep included), no waiting on the network."""
        self.step += 1
        self.tokens += tokens
        d = {"t": time.time(), "step": self.step, "tokens": self.tokens, "loss": round(loss, 4),
             "c": round(compute_s, 4)}  # fmt: skip
        self.f.write(json.dumps(d) + "\n")
        self.f.flush()

    def note(self, **kv: object) -> None:
        """A line that is not a step (e.g. an outer sync and whether it committed)."""
        self.f.write(json.dumps({"t": time.time(), "note": kv}) + "\n")
        self.f.flush()


class Straggler:
    """Makes a learner `factor` times slower by sleeping after each step's compute."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.t0 = time.perf_counter()

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def done(self) -> None:
        if self.factor > 1:
            time.sleep((self.factor - 1) * (time.perf_counter() - self.t0))


def save_global(model: nn.Module, folder: Path, tokens_hint: int = 0) -> None:
    """Write the model's parameters as the global model at this instant (atomically)."""
    folder.mkdir(parents=True, exist_ok=True)
    t = time.time()
    tmp = folder / f".{t:.3f}.pt"
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"t": t, "tokens_hint": tokens_hint, "state": sd}, tmp)
    os.replace(tmp, folder / f"{t:.3f}.pt")


def setup_threads() -> None:
    torch.set_num_threads(int(os.environ.get("PEER_THREADS", "1")))
