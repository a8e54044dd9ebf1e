"""Split a fragment payload into chunks and put it back together, checking size and crc32.

A payload travels as a header (carrying `total_bytes` and `crc32` of the whole payload) followed
by chunks of at most `chunk_bytes`. `Assembler` collects chunks and only yields the payload once
it is complete and its checksum matches; anything else raises `TransferError` with the reason,
so a transfer cut in the middle never produces a partial payload. Memory: the chunks held are
never more than `total_bytes` <= `limit`, and `payload()` joins them once (2 x limit at most).
"""

from __future__ import annotations

from collections.abc import Iterator

from atoll import checksum

DEFAULT_CHUNK = 256 * 1024


class TransferError(ValueError):
    """A chunked transfer that cannot be accepted; the message says why. (Its subclass
    `atoll.wire.convert.MessageError` is a message whose fields cannot be used.)"""


def crc32(payload: bytes) -> int:
    return checksum.crc32(payload) & 0xFFFFFFFF


def split(payload: bytes, chunk_bytes: int = DEFAULT_CHUNK) -> Iterator[bytes]:
    """The payload in chunks of at most `chunk_bytes` (an empty payload gives no chunk)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes={chunk_bytes} must be >= 1")
    view = memoryview(payload)
    for i in range(0, len(payload), chunk_bytes):
        yield bytes(view[i : i + chunk_bytes])


class Assembler:
    """Collects the chunks of one payload announced with `total_bytes` and `crc`."""

    def __init__(self, total_bytes: int, crc: int, limit: int) -> None:
        if total_bytes < 0:
            raise TransferError(f"payload of {total_bytes} bytes: a size must be >= 0")
        if total_bytes > limit:
            raise TransferError(f"payload of {total_bytes} bytes is over the limit of {limit}")
        self.total, self.crc = total_bytes, crc
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.total:
            raise TransferError(f"received more than the announced {self.total} bytes")
        self.parts.append(chunk)

    @property
    def complete(self) -> bool:
        return self.size == self.total

    def payload(self) -> bytes:
        if self.size != self.total:
            raise TransferError(f"transfer ended after {self.size} of {self.total} bytes")
        data = b"".join(self.parts)
        if crc32(data) != self.crc:
            raise TransferError("checksum mismatch: the fragment was corrupted in transfer")
        return data
