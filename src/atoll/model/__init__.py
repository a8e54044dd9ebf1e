"""The built-in model and data: a byte-level GPT on the Python standard library's sources.

- gpt.py     the model
- data.py    the byte corpus, its shards and batches
- recipe.py  the model from the settings (seeded init), its corpus and fragment plan, and the
             safetensors files of a custom model (`save_init`, `file_plan`)
- train.py   inner optimizer and schedule, train step, data streams, evaluation
"""

from atoll.model.data import ByteCorpus, load_stdlib_corpus
from atoll.model.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig", "ByteCorpus", "load_stdlib_corpus"]
