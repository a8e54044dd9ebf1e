"""A safetensors blob as pieces: its length-prefixed JSON header, then each tensor's own memory,
never joined into one bytes object. The tape record and the snapshot write every value this
way, once, and their crc32 runs over the same pieces (a joined blob cost a copy of each value
and its page faults: a sixth of the syncer's CPU at a 100M-parameter model, BENCHMARKS.md).
Any safetensors reader reads it (store_read.parse)."""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

from atoll import checksum

DTYPES = {torch.float32: "F32"}  # what the syncer's state holds


def pieces(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> list[Any]:
    """The blob of `tensors` (float32, in name order) with string `metadata`, as buffers."""
    header: dict[str, Any] = {"__metadata__": metadata}
    data = []
    off = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        if t.dtype not in DTYPES:
            raise ValueError(f"tensor {name} is {t.dtype}: only {list(DTYPES)} are written")
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + nbytes]}  # fmt: skip
        data.append(memoryview(t.reshape(-1).numpy()).cast("B"))
        off += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-aligned, as safetensors writes it
    return [struct.pack("<Q", len(text)), text, *data]


def size(parts: list[Any]) -> int:
    return sum(len(p) for p in parts)


def crc32(parts: list[Any]) -> int:
    c = 0
    for p in parts:
        c = checksum.crc32(p, c)
    return c & 0xFFFFFFFF


def joined(parts: list[Any]) -> bytes:
    """The blob as one bytes object (for a reader in memory, a test)."""
    return b"".join(bytes(p) for p in parts)
