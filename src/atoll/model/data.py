"""Corpora: what the built-in model trains on, and the public `token_batches` helper.

A corpus is a flat sequence of token ids with a train split, dealt to learners in shards, and
a held-out eval split. Two kinds:

- text (`ByteCorpus`): the bytes of text files are the tokens (vocabulary 256). The default is
  the Python standard library's own source files, present on every machine with Python (no
  download), read in sorted order so that it is the same for a given Python version.
- token files (`TokenCorpus.from_file`): a flat array of token ids, the layout nanoGPT's
  prepare scripts write (`np.array(ids, dtype=np.uint16).tofile("train.bin")`; uint32 for
  vocabularies over 65535), memory-mapped: a large file is never copied into memory.

The held-out split is the last `eval_fraction` of the tokens (at least one), unless a separate
held-out file is given; the train split is the rest. Bad input is a ConfigError naming the
setting (`data` or `eval_data`), its value and what is allowed.
"""

from __future__ import annotations

import fnmatch
import itertools
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from atoll.config.settings import DATA_DTYPES
from atoll.errors import ConfigError

TOKEN_SUFFIX = ".bin"  # a data path ending in this is a token file


def _py_files(folder: str) -> Iterator[Path]:
    """The files named *.py under `folder`, in the order `sorted(Path(folder).rglob("*.py"))`
    gives them (paths compare part by part: a walk that takes each folder's entries sorted by
    name), but lazily, so that the first few MB need not list the whole tree; folders named
    site-packages or test are skipped and symlinked folders not entered, as rglob does."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if fnmatch.fnmatchcase(e.name, "*.py"):
            yield Path(e.path)
        try:
            inside = e.is_dir(follow_symlinks=False)
        except OSError:
            inside = False
        if inside and e.name not in ("site-packages", "test"):
            yield from _py_files(e.path)


def load_stdlib_corpus(max_bytes: int = 4_000_000) -> bytes:
    """Concatenate the standard library's .py files (sorted by path, none under a folder named
    site-packages or test) up to `max_bytes`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    skipped = "site-packages" in root.parts or "test" in root.parts
    for path in [] if skipped else _py_files(str(root)):
        try:
            out += path.read_bytes() + b"\n"
        except OSError:
            continue
        if len(out) >= max_bytes:
            break
    if len(out) < 100_000:
        raise RuntimeError(f"standard library sources under {root} gave only {len(out)} bytes")
    return bytes(out[:max_bytes])


def data_paths(data: str) -> list[str]:
    """The file paths of a `data` / `eval_data` setting (comma separated)."""
    return [p.strip() for p in data.split(",") if p.strip()]


def is_token_data(data: str) -> bool:
    """Whether a `data` setting names a token file (its path ends in .bin)."""
    return any(p.endswith(TOKEN_SUFFIX) for p in data_paths(data))


def _check_file(key: str, data: str, path: str, kind: str) -> int:
    """The size of `path` (one file of setting `key`); a ConfigError unless it is a readable,
    non-empty file."""
    p = Path(path)
    if not p.is_file():
        why = "is a directory" if p.is_dir() else "does not exist"
        raise ConfigError(key, data, f"{kind}; {path} {why}")
    size = p.stat().st_size
    if size == 0:
        raise ConfigError(key, data, f"{kind}, not empty; {path} has 0 bytes")
    return size


def load_text_files(paths: list[str], max_bytes: int, key: str = "data") -> bytes:
    """The files' bytes, concatenated, up to `max_bytes`."""
    kind = '"stdlib", or text files (comma separated)'
    if not paths:
        raise ConfigError(key, "", kind)
    out = bytearray()
    for p in paths:
        if p.endswith(TOKEN_SUFFIX):
            allowed = f"text files, or one token file ending in {TOKEN_SUFFIX} alone"
            raise ConfigError(key, ",".join(paths), allowed)
        _check_file(key, ",".join(paths), p, kind)
        try:
            out += Path(p).read_bytes()
        except OSError as exc:
            raise ConfigError(
                key, ",".join(paths), f"readable files; {p}: {exc.strerror}"
            ) from None
        if len(out) >= max_bytes:
            break
    return bytes(out[:max_bytes])


def load_corpus_bytes(data: str, max_bytes: int, key: str = "data") -> bytes:
    """The bytes of a text setting: "stdlib", or comma-separated text file paths."""
    if data == "stdlib":
        return load_stdlib_corpus(max_bytes)
    return load_text_files(data_paths(data), max_bytes, key)


def map_token_file(path: str, dtype: str = "uint16", key: str = "data") -> np.ndarray:
    """A token file as a read-only memory-mapped array of `dtype` (nothing is read yet)."""
    dtype_key = "dtype" if key == "path" else "data_dtype"  # token_batches' or a setting
    if dtype not in DATA_DTYPES:
        raise ConfigError(dtype_key, dtype, f"one of {', '.join(DATA_DTYPES)}")
    paths = data_paths(path)
    kind = f"one token file ending in {TOKEN_SUFFIX}"
    if len(paths) != 1 or not paths[0].endswith(TOKEN_SUFFIX):
        raise ConfigError(key, path, f"{kind} (or text files, none ending in {TOKEN_SUFFIX})")
    size = _check_file(key, path, paths[0], kind)
    item = np.dtype(dtype).itemsize
    if size % item:
        allowed = (
            f"a file of {dtype} token ids: a multiple of {item} bytes ({paths[0]} has {size}; "
            f"{dtype_key} says how the ids are stored: {', '.join(DATA_DTYPES)})"
        )
        raise ConfigError(key, path, allowed)
    try:
        return np.memmap(paths[0], dtype=dtype, mode="r")
    except OSError as exc:
        raise ConfigError(key, path, f"a readable file; {paths[0]}: {exc.strerror}") from None


class Shard:
    """A view of some of a token array, as one sequence: `n_blocks` blocks of `block` tokens,
    block k starting at `start + k * stride`. Nothing is copied; `windows` gathers only the
    tokens asked for."""

    def __init__(self, tokens: np.ndarray, start: int, block: int, stride: int, n: int) -> None:
        self.tokens, self.start, self.block, self.stride = tokens, start, block, stride
        self.n_blocks = n if block > 0 else 0

    def __len__(self) -> int:
        return self.n_blocks * self.block

    def windows(self, starts: list[int], length: int) -> torch.Tensor:
        """Rows of `length` consecutive tokens from each start, as int64 (one row a start)."""
        pos = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(length, dtype=np.int64)
        index = self.start + (pos // self.block) * self.stride + pos % self.block
        return torch.from_numpy(np.ascontiguousarray(self.tokens[index], dtype=np.int64))


def whole(tokens: np.ndarray) -> Shard:
    return Shard(tokens, 0, len(tokens), len(tokens), 1)


def split(tokens: np.ndarray, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, held out): the held-out split is the last `eval_fraction` of the tokens (at
    least one token), the train split the rest; views, not copies."""
    n_eval = max(int(len(tokens) * eval_fraction), 1)
    return tokens[:-n_eval], tokens[-n_eval:]


class TokenCorpus:
    """Token ids (1-D numpy arrays, memory-mapped or not) in a train split, dealt to learners
    in shards, and a held-out eval split."""

    def __init__(self, train: np.ndarray, eval: np.ndarray) -> None:
        self.train, self.eval = train, eval
        self._max_id: int | None = None

    @classmethod
    def split(cls, tokens: np.ndarray, eval_fraction: float = 0.1) -> TokenCorpus:
        """Held out: the last `eval_fraction` of the tokens (at least one); train: the rest."""
        return cls(*split(tokens, eval_fraction))

    @classmethod
    def from_file(
        cls,
        path: str,
        dtype: str = "uint16",
        eval_fraction: float = 0.1,
        eval_path: str = "",
    ) -> TokenCorpus:
        """A token file, memory-mapped; held out: `eval_path` (a token file of the same dtype,
        e.g. nanoGPT's val.bin), else the last `eval_fraction` of the file."""
        tokens = map_token_file(path, dtype)
        if eval_path:
            return cls(tokens, map_token_file(eval_path, dtype, "eval_data"))
        return cls.split(tokens, eval_fraction)

    def max_id(self) -> int:
        """The largest token id in either split (reads every token once, without a copy)."""
        if self._max_id is None:
            self._max_id = max(int(a.max()) if len(a) else 0 for a in (self.train, self.eval))
        return self._max_id

    def shard(self, index: int, count: int, block: int = 4096) -> Shard:
        """Shard `index` of `count` of the train split: blocks of `block` tokens dealt round
        robin (block i goes to shard i mod count), so shards are disjoint but each one samples
        the whole corpus. `block=0` gives contiguous shards instead (strongly non-IID for the
        standard library: its modules differ a lot)."""
        n = len(self.train)
        if count == 1:
            return whole(self.train)
        if block <= 0:
            size = n // count
            return Shard(self.train, index * size, size, size, 1)
        n_blocks = n // block
        mine = len(range(index, n_blocks, count))
        return Shard(self.train, index * block, block, count * block, mine)

    @staticmethod
    def batch(
        source: Shard, batch: int, context: int, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of `context`+1 tokens from `source` (seeded by `gen`): inputs, and
        targets one token on."""
        starts = torch.randint(0, len(source) - context - 1, (batch,), generator=gen)
        rows = source.windows(starts.tolist(), context + 1)
        return rows[:, :-1], rows[:, 1:]

    def eval_batches(self, n: int, batch: int, context: int, seed: int) -> list:
        gen = torch.Generator().manual_seed(seed)
        source = whole(self.eval)
        return [self.batch(source, batch, context, gen) for _ in range(n)]


class ByteCorpus(TokenCorpus):
    """Text as tokens: each byte one token (ids 0-255). Held out: `eval_data`'s bytes if
    given, else the last `eval_fraction` of `data`."""

    def __init__(
        self, data: bytes, eval_fraction: float = 0.1, eval_data: bytes | None = None
    ) -> None:
        tokens = np.frombuffer(data, dtype=np.uint8)
        if eval_data is not None:
            super().__init__(tokens, np.frombuffer(eval_data, dtype=np.uint8))
        else:
            super().__init__(*split(tokens, eval_fraction))


def token_batches(
    path: str,
    batch: int,
    context: int,
    *,
    dtype: str = "uint16",
    learner: int = 0,
    learners: int = 1,
    seed: int = 0,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (inputs, targets) batches of a token file for your own training loop: random
    windows of `context`+1 token ids (int64 tensors of shape (batch, context), targets one
    token on) from shard `learner` of `learners` of the whole file (4096-token blocks dealt
    round robin), seeded by `seed` and `learner`. Hold out a separate file (val.bin). A bad
    file or argument is a ConfigError at the call::

        for x, y in token_batches("train.bin", batch=8, context=256, learner=i, learners=4):
            loss = F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())
    """
    if not 0 <= learner < learners:
        raise ConfigError("learner", learner, f"an integer in [0, learners={learners})")
    tokens = map_token_file(path, dtype, key="path")
    source = TokenCorpus(tokens, tokens[:0]).shard(learner, learners)
    if len(source) < context + 2:
        allowed = f"a file with at least {context + 2} tokens in shard {learner} of {learners}"
        raise ConfigError("path", path, allowed)
    gen = torch.Generator().manual_seed(seed * 1000 + learner)
    return (TokenCorpus.batch(source, batch, context, gen) for _ in itertools.count())
