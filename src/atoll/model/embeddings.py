"""Which of a model's parameters are embeddings, found from the model itself.

Embedding tensors get a fragment of their own and are merged by weighted mean
(atoll.core.fragments.make_plan). They are found by module type: the parameters of every
`nn.Embedding` / `nn.EmbeddingBag`, and an output head tied to one of them. A tied head is the
same Parameter object (how transformers ties `lm_head.weight` to the token embedding), which
`named_parameters()` lists once, under the first name it meets; the name returned here is always
that one. A head that is a Parameter of its own over the very same memory (same address, shape
and device) counts too.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

import torch.nn as nn

from atoll.errors import ConfigError

EMBEDDING_TYPES = (nn.Embedding, nn.EmbeddingBag)
_LAYER = re.compile(r"\.\d+\.")  # a tensor inside a numbered layer ("layers.3.")


def embedding_names(model: nn.Module, override: Iterable[str] | None = None) -> set[str]:
    """The names (as `model.named_parameters()` gives them) of the model's embedding tensors.

    `override`: explicit names, used instead of the detected ones; each must be a parameter
    name of the model (otherwise ConfigError naming it and the allowed names)."""
    params = dict(model.named_parameters())
    if override is not None:
        names = set(override)
        for name in sorted(names):
            if name not in params:
                raise ConfigError("embeddings", name, allowed_names(name, params))
        return names
    tables = [
        m.weight for m in model.modules() if isinstance(m, EMBEDDING_TYPES) and m.weight is not None
    ]
    ids = {id(t) for t in tables}
    views = {_view(t) for t in tables if t.numel() > 0}
    return {n for n, p in params.items() if id(p) in ids or (p.numel() > 0 and _view(p) in views)}


def _view(t: nn.Parameter) -> tuple[int, tuple[int, ...], str]:
    return t.data_ptr(), tuple(t.shape), str(t.device)


def allowed_names(name: str, names: Iterable[str], show: int = 12) -> str:
    """What an unknown tensor name is told: the close spellings, then the names (the first
    `show` of them, those outside numbered layers first: embeddings, heads, final norms)."""
    names = sorted(names, key=lambda n: (_LAYER.search(f".{n}") is not None, n))
    close = [n for n in names if name in n][:3] or difflib.get_close_matches(name, names, n=3)
    listed = ", ".join(names[:show]) + (f", ... ({len(names)} in all)" if len(names) > show else "")
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return f"{hint}a parameter name of the model: {listed}"
