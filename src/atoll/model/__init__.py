"""The built-in model and data: a small GPT, by default byte-level on the Python standard
library's sources; or on your own text, or your own token files (`data=...`).

- gpt.py     the model
- data.py    corpora (text as bytes, token files memory-mapped), their shards and batches, and
             `token_batches` (a token file's batches for your own training loop)
- recipe.py  the model from the settings (seeded init), its corpus and fragment plan, and the
             safetensors files of a custom model (`save_init`, `file_plan`)
- train.py   inner optimizer and schedule, train step, data streams, evaluation
"""

from atoll.model.data import ByteCorpus, TokenCorpus, load_stdlib_corpus, token_batches
from atoll.model.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig", "ByteCorpus", "TokenCorpus", "load_stdlib_corpus", "token_batches"]
