"""Messages over the socket pair between a learner and its communication process.

A frame is an 8-byte little-endian length and a pickle (atoll.live.comm.messages). Both
ends use this module:
- `write_frame`: one `sendall` for a small message (header and pickle together); a large one
  goes as two, so the pickle is not copied. No pickler object is kept or rebuilt per message.
- `FrameReader.read`: everything waiting, with one non-blocking `recv_into` into a reused
  buffer (a fresh 1 MiB bytes per recv costs ~25 us), parsed at once: a step boundary costs
  one read for all that arrived, no poll or select per message. `wait` > 0 (or None: no
  limit) first waits for something to arrive.
"""

from __future__ import annotations

import pickle
import select
import socket
import struct

_LEN = struct.Struct("<Q")
_SMALL = 1 << 16  # below this, header and pickle go in one sendall


def write_frame(sock: socket.socket, msg: object) -> None:
    """Send one message (blocking until the kernel took it); OSError when the peer is gone."""
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    head = _LEN.pack(len(data))
    if len(data) < _SMALL:
        sock.sendall(head + data)
    else:
        sock.sendall(head)
        sock.sendall(data)


class FrameReader:
    """Reads frames from `sock`; `closed` once the peer has gone (end of file or an error)."""

    def __init__(self, sock: socket.socket, chunk_bytes: int = 1 << 20) -> None:
        self.sock = sock
        self.closed = False
        self._buf = bytearray()
        self._chunk = bytearray(chunk_bytes)

    def read(self, wait: float | None = 0.0) -> list[object]:
        """Every complete message waiting now (after waiting up to `wait` s for data)."""
        if self.closed:
            return []
        if (wait is None or wait > 0) and not select.select([self.sock], [], [], wait)[0]:
            return []
        self._receive()
        return self._parse()

    def _receive(self) -> None:
        chunk = self._chunk
        while True:
            try:
                n = self.sock.recv_into(chunk, len(chunk), socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.closed = True
                return
            if not n:
                self.closed = True
                return
            self._buf += memoryview(chunk)[:n]
            if n < len(chunk):
                return

    def _parse(self) -> list[object]:
        buf, out, at = self._buf, [], 0
        with memoryview(buf) as view:
            while len(buf) - at >= _LEN.size:
                (n,) = _LEN.unpack_from(buf, at)
                end = at + _LEN.size + n
                if len(buf) < end:
                    break
                with view[at + _LEN.size : end] as body:
                    out.append(pickle.loads(body))
                at = end
        if at:
            del buf[:at]
        return out
