"""Bytes on the wire from the kernel's TCP counters (atoll.live.comm.wire), on loopback."""

from __future__ import annotations

import socket
import sys
import threading

import pytest

from atoll.live.comm.wire import FRAME, WireCounter

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux TCP_INFO")


def _sink() -> tuple[socket.socket, threading.Thread, list]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    got: list = []

    def run() -> None:
        c, _ = srv.accept()
        n = 0
        while data := c.recv(1 << 16):
            n += len(data)
        c.sendall(b"y" * 1000)
        c.close()
        got.append(n)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return srv, t, got


def test_counts_what_the_sockets_to_the_syncer_carried_and_keeps_it_after_close():
    srv, t, got = _sink()
    other, t2, _ = _sink()  # a socket to another port is not the syncer's
    port = srv.getsockname()[1]
    w = WireCounter(f"127.0.0.1:{port}", every_s=0.0)
    s = socket.create_connection(("127.0.0.1", port))
    o = socket.create_connection(("127.0.0.1", other.getsockname()[1]))
    assert w.read()[0] < 1000  # connected: identified as ours while its peer can be asked
    s.sendall(b"x" * 300_000)
    o.sendall(b"z" * 500_000)
    s.shutdown(socket.SHUT_WR)
    t.join(5)
    assert got == [300_000]  # the sink has it all: the kernel has sent it
    up, down = w.read()
    assert 300_000 < up < 300_000 + FRAME * 300_000 // 1000 and down < 300_000
    while s.recv(1 << 16):
        pass
    w.read()
    s.close()
    o.close()
    up2, down2 = w.read()  # closed: its last reading stays
    assert up2 >= up and 1000 < down2 < up2
