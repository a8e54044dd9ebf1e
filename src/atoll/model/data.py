"""The default corpus: the Python standard library's own source files, as bytes.

Present on every machine with Python, so the first run needs no download. Files are read in
sorted order, so the corpus is the same for a given Python version; the last `eval_fraction` of
the bytes is the held-out split. Users can pass their own text files instead.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch


def load_stdlib_corpus(max_bytes: int = 4_000_000) -> bytes:
    """Concatenate the standard library's .py files (sorted by path) up to `max_bytes`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            out += path.read_bytes() + b"\n"
        except OSError:
            continue
        if len(out) >= max_bytes:
            break
    if len(out) < 100_000:
        raise RuntimeError(f"standard library sources under {root} gave only {len(out)} bytes")
    return bytes(out[:max_bytes])


def load_text_files(paths: list[str], max_bytes: int) -> bytes:
    out = bytearray()
    for p in paths:
        out += Path(p).read_bytes()
        if len(out) >= max_bytes:
            break
    return bytes(out[:max_bytes])


def load_corpus_bytes(data: str, max_bytes: int) -> bytes:
    """The bytes of setting `data`: "stdlib", or comma-separated text file paths."""
    if data == "stdlib":
        return load_stdlib_corpus(max_bytes)
    return load_text_files([p for p in data.split(",") if p], max_bytes)


class ByteCorpus:
    """A byte corpus with a train split divided into shards and a held-out eval split."""

    def __init__(self, data: bytes, eval_fraction: float = 0.1) -> None:
        arr = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        n_eval = max(int(len(arr) * eval_fraction), 1)
        self.train = arr[:-n_eval]
        self.eval = arr[-n_eval:]

    def shard(self, index: int, count: int, block: int = 4096) -> torch.Tensor:
        """Shard `index` of `count` of the train split: blocks of `block` bytes dealt round
        robin (block i goes to shard i mod count), so shards are disjoint but each one samples
        the whole corpus. `block=0` gives contiguous shards instead (strongly non-IID here:
        the standard library's modules differ a lot)."""
        if count == 1:
            return self.train
        if block <= 0:
            size = len(self.train) // count
            return self.train[index * size : (index + 1) * size]
        n_blocks = len(self.train) // block
        blocks = self.train[: n_blocks * block].view(n_blocks, block)
        return blocks[index::count].reshape(-1)

    @staticmethod
    def batch(
        source: torch.Tensor, batch: int, context: int, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of `context`+1 bytes from `source` (seeded by `gen`)."""
        starts = torch.randint(0, len(source) - context - 1, (batch,), generator=gen)
        rows = torch.stack([source[s : s + context + 1] for s in starts.tolist()])
        return rows[:, :-1], rows[:, 1:]

    def eval_batches(self, n: int, batch: int, context: int, seed: int) -> list:
        gen = torch.Generator().manual_seed(seed)
        return [self.batch(self.eval, batch, context, gen) for _ in range(n)]
