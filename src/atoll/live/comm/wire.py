"""Bytes on the wire, measured where they travel: the kernel's own counters of this process's
TCP connections to the syncer (Linux `TCP_INFO`), not a model of the framing.

For each socket connected to the syncer's address: tcpi_bytes_sent and tcpi_bytes_received
(TCP payload: gRPC, HTTP/2 and TLS bytes, retransmissions included) plus 66 bytes per segment
in either direction (tcpi_segs_out / tcpi_segs_in: 14 of Ethernet, 20 of IPv4 and 32 of TCP
with timestamps), which is what a network interface counts for the same traffic. A socket's
last reading is kept after it closes (a reconnect opens new ones), so the totals only grow;
what a socket carried after its last reading is missed (a reading is taken with every status
report, at most every `every_s`). Elsewhere than Linux, or where the fields are missing, the
counter reads None.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading
import time

FRAME = 66  # Ethernet + IPv4 + TCP (timestamps) header bytes of one segment
# offsets in struct tcp_info (linux/tcp.h): bytes_received u64 @128, segs_out u32 @136,
# segs_in u32 @140, bytes_sent u64 @200 (Linux 4.19+)
_NEED = 208


class WireCounter:
    def __init__(self, address: str, every_s: float = 1.0) -> None:
        port = address.rpartition(":")[2]
        self.port = int(port) if port.isdigit() else -1  # the syncer's: sockets to it count
        self.every_s = every_s
        self.seen: dict[int, tuple[int, int]] = {}  # socket inode -> (wire out, wire in)
        self.at = 0.0
        self.ok = sys.platform.startswith("linux")
        self.lock = threading.Lock()  # status reports come from several threads

    def read(self, fresh: bool = False) -> tuple[int, int] | None:
        """(bytes out, bytes in) on the wire so far, or None where it cannot be measured;
        the sockets are read again when `fresh` or `every_s` after the last reading."""
        with self.lock:
            if not self.ok:
                return None
            now = time.monotonic()
            if fresh or now - self.at >= self.every_s:
                self.at = now
                self._sample()
            if not self.ok:
                return None
            return sum(v[0] for v in self.seen.values()), sum(v[1] for v in self.seen.values())

    def _sample(self) -> None:
        try:
            fds = os.listdir("/proc/self/fd")
        except OSError:
            self.ok = False
            return
        for name in fds:
            try:
                link = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            if not link.startswith("socket:["):
                continue
            inode = int(link[8:-1])
            got = self._info(int(name), known=inode in self.seen)
            if got is not None:
                self.seen[inode] = got

    def _info(self, fd: int, known: bool) -> tuple[int, int] | None:
        """The socket's counters if it is one of ours (`known`: identified earlier, when its
        peer could still be asked; a closing socket cannot say whom it was connected to)."""
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            return None
        try:
            if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            if not known and s.getpeername()[1] != self.port:
                return None
            raw = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        except OSError:
            return None
        finally:
            s.close()
        if len(raw) < _NEED:
            self.ok = False  # an older kernel: no bytes_sent
            return None
        (received,) = struct.unpack_from("<Q", raw, 128)
        segs_out, segs_in = struct.unpack_from("<II", raw, 136)
        (sent,) = struct.unpack_from("<Q", raw, 200)
        return sent + FRAME * segs_out, received + FRAME * segs_in
