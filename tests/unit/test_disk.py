"""disk.Writer: the syncer's snapshots and tape segments written past the page cache. Whatever
path it takes (O_DIRECT through an aligned buffer, or buffered), the file holds exactly the
bytes appended, at every moment between writes, and a writer reopened on a file continues it."""

from __future__ import annotations

import os
import random

import pytest

from atoll.live.syncer import disk


def _pieces(rng: random.Random, n: int) -> list:
    out = []
    for _ in range(n):
        size = rng.choice([0, 1, 7, 8, 4095, 4096, 4097, 10_000, disk.CHUNK - 3, disk.CHUNK + 5])
        data = rng.randbytes(size)
        out.append(memoryview(data) if rng.random() < 0.5 else data)
    return out


@pytest.mark.parametrize("direct", ["1", "0"])
def test_appends_leave_exactly_the_bytes_written(tmp_path, monkeypatch, direct):
    monkeypatch.setattr(disk, "_ON", direct == "1")
    rng = random.Random(5)
    path = tmp_path / "f.tape"
    want = b""
    w = disk.Writer(path, fresh=False)
    if direct == "0":
        assert not w.direct
    for k in range(6):
        parts = _pieces(rng, rng.randint(1, 4))
        w.write(parts)
        want += b"".join(bytes(p) for p in parts)
        assert path.read_bytes() == want  # no padding past the end, between writes
        assert w.length == len(want)
        if k == 2:  # a second writer continues the file where the first stopped
            w.close()
            w = disk.Writer(path, fresh=False)
            assert w.length == len(want)
    w.sync()
    w.close()
    with disk.Writer(path) as fresh:  # fresh: truncated
        fresh.write([b"abc"])
    assert path.read_bytes() == b"abc"


def test_a_filesystem_that_refuses_direct_writes_gets_buffered_ones(tmp_path, monkeypatch):
    """O_DIRECT accepted at open but refused at the write (EINVAL): the same bytes, buffered."""
    path = tmp_path / "s.tmp"
    w = disk.Writer(path)
    if not w.direct:
        pytest.skip("this filesystem or OS has no O_DIRECT: the fallback is the only path")
    real = os.pwrite
    calls = {"n": 0}

    def refuse_direct(fd, data, at):
        calls["n"] += 1
        if w.direct:
            raise OSError(22, "Invalid argument")
        return real(fd, data, at)

    monkeypatch.setattr(os, "pwrite", refuse_direct)
    w.write([b"x" * 5000, b"y" * 3])
    w.write([b"z"])
    w.close()
    assert not w.direct and calls["n"] >= 3
    assert path.read_bytes() == b"x" * 5000 + b"y" * 3 + b"z"


def test_a_failed_write_raises_its_own_error_through_the_writers_close(tmp_path, monkeypatch):
    """A full disk (ENOSPC) while a snapshot is written: the OSError reaches the snapshot
    thread (which tries again at the next one), not an error of closing the buffer."""

    def full(fd, data, at):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    for direct in (True, False):
        monkeypatch.setattr(disk, "_ON", direct)
        with pytest.raises(OSError) as err, disk.Writer(tmp_path / "s.tmp") as w:
            w.write([b"x" * 5000])
        assert err.value.errno == 28
