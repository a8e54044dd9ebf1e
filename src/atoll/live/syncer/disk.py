"""The syncer's big files written past the page cache: snapshots and tape segments.

A buffered write of a GB copies every byte into the page cache, and once the cache is full
the kernel reclaims pages on the writer's own time: 0.4 to 4 ns of system CPU per byte on this
machine, most of a 100M-parameter syncer's CPU (BENCHMARKS.md §10c). With O_DIRECT the bytes go
from an aligned buffer straight to the device: a copy into that buffer (about 0.2 ns a byte)
is the only CPU it costs, and the syncer's cache stays for what it reads.

`Writer` appends to one file. O_DIRECT wants whole aligned blocks, so it keeps the file's last
partial block in memory, rewrites it with the next write and cuts the file back to its true
length (`ftruncate`): a reader, and a restore after a crash, see exactly the bytes written.
Where the OS has no O_DIRECT, the filesystem refuses it (tmpfs), or ATOLL_DIRECT_IO=0, it
writes through the page cache as before, the same bytes.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path
from typing import Any

ALIGN = 4096  # the largest logical block size O_DIRECT asks for on Linux
CHUNK = 8 << 20  # the aligned buffer: one write to the device
_ON = os.environ.get("ATOLL_DIRECT_IO", "1") != "0"


def _direct_flag() -> int:
    return getattr(os, "O_DIRECT", 0) if _ON else 0


class Writer:
    """Appends byte pieces to `path` (truncated first if `fresh`, else continued at its end)."""

    def __init__(self, path: Path, fresh: bool = True) -> None:
        self.path = Path(path)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if fresh else 0)
        self.length = 0 if fresh or not self.path.exists() else self.path.stat().st_size
        self.direct = False
        self.fd = -1
        if _direct_flag():
            try:
                self.fd = os.open(self.path, flags | _direct_flag(), 0o644)
                self.direct = True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
        if self.fd < 0:
            self.fd = os.open(self.path, flags, 0o644)
        self._buf = mmap.mmap(-1, CHUNK) if self.direct else None  # page-aligned
        self._tail = b""  # the bytes of the file's last partial block (direct only)
        if self.direct and self.length % ALIGN:
            with open(self.path, "rb") as fh:
                fh.seek(self.length - self.length % ALIGN)
                self._tail = fh.read()

    def write(self, parts: list[Any]) -> None:
        """Append every piece (bytes, memoryviews), in order, at the file's end."""
        start = self.length
        if self.direct:
            try:
                self._write_direct(parts)
                return
            except OSError as exc:  # a filesystem that opened O_DIRECT but will not write it
                if exc.errno != errno.EINVAL:
                    raise
                self._buffered()
        for p in parts:
            data = memoryview(p).cast("B")
            self._pwrite_all(data, start)
            start += len(data)
        self.length = start

    def _write_direct(self, parts: list[Any]) -> None:
        assert self._buf is not None
        mv = memoryview(self._buf)
        fill = len(self._tail)
        mv[:fill] = self._tail
        at = self.length - fill  # a block boundary
        for p in parts:
            src = memoryview(p).cast("B")
            off = 0
            while off < len(src):
                k = min(CHUNK - fill, len(src) - off)
                mv[fill : fill + k] = src[off : off + k]
                fill += k
                off += k
                if fill == CHUNK:
                    self._pwrite_all(mv, at)
                    at += CHUNK
                    fill = 0
        whole = fill - fill % ALIGN
        padded = whole + (ALIGN if fill % ALIGN else 0)
        if padded:
            mv[fill:padded] = bytes(padded - fill)
            self._pwrite_all(mv[:padded], at)
        self._tail = bytes(mv[whole:fill])
        self.length = at + fill
        if padded != fill:
            os.ftruncate(self.fd, self.length)  # the padding was never data

    def _pwrite_all(self, data: memoryview, at: int) -> None:
        done = 0
        while done < len(data):
            done += os.pwrite(self.fd, data[done:], at + done)

    def _buffered(self) -> None:
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_WRONLY)
        self.direct = False
        self._buf = None  # freed once no view of it is left (see close)
        self._tail = b""

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        # the buffer is dropped, not closed: a failed write's traceback may still hold a view
        # of it, and closing it then would raise over the write's own error
        self._buf = None

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
