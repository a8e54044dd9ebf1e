"""The built-in model and data: a byte-level GPT on the Python standard library's sources."""

from atoll.model.data import ByteCorpus, load_stdlib_corpus
from atoll.model.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig", "ByteCorpus", "load_stdlib_corpus"]
