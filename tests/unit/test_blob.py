"""The tape's and the snapshot's blobs written as pieces (atoll.live.syncer.blob): what a
safetensors reader reads back, and the checksum of the joined bytes."""

from __future__ import annotations

import zlib

import pytest
import torch
from safetensors.torch import load

from atoll.live.syncer import blob
from atoll.live.syncer.store_read import _metadata


def test_the_pieces_are_a_safetensors_blob_with_its_tensors_and_metadata():
    tensors = {"b.theta": torch.randn(1001), "a.public": torch.randn(3, 5),
               "c.empty": torch.zeros(0), "d.scalar": torch.tensor(2.5)}  # fmt: skip
    parts = blob.pieces(tensors, {"json": '{"seq": 3}', "x": "é"})
    joined = b"".join(bytes(p) for p in parts)
    got = load(joined)
    assert sorted(got) == sorted(tensors)
    for k, t in tensors.items():
        assert torch.equal(got[k], t)
    assert _metadata(joined) == {"json": '{"seq": 3}', "x": "é"}
    assert blob.size(parts) == len(joined)
    assert blob.crc32(parts) == zlib.crc32(joined)
    assert blob.joined(parts) == joined


def test_a_tensor_of_another_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="tensor w is torch.float64"):
        blob.pieces({"w": torch.zeros(3, dtype=torch.float64)}, {})


def test_the_checksum_is_zlibs_crc32_by_isal():
    """atoll.checksum: ISA-L's crc32 (a dependency), zlib's values, chained the same way."""
    from atoll import checksum

    data = bytes(range(256)) * 1000
    assert checksum.crc32(data) == zlib.crc32(data)
    assert checksum.crc32(data[500:], checksum.crc32(data[:500])) == zlib.crc32(data)
    assert "isal" in checksum.crc32.__module__
