"""A syncer's address as a learner is given it (`Learner(syncer=...)`, `atoll learner
--syncer`): `host:port`, or a sharded syncer's `host:port,host:port,...` in shard order; and
free ports for a launcher to give its syncer and pages (`free_port`)."""

from __future__ import annotations

import socket

from atoll.errors import ConfigError


def check_addresses(syncer: str, setting: str = "syncer") -> list[str]:
    """Each address of `syncer`, `host:port` with a port in [1, 65535] (an IPv6 host in
    brackets); a ConfigError naming the value otherwise (an empty one included: a script that
    read RUN_DIR/syncer.addr before the syncer wrote it)."""
    out = []
    for a in str(syncer).split(","):
        host, _, port = a.strip().rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(
                setting,
                syncer,
                "host:port with a port in [1, 65535], or a sharded syncer's host:port,... in "
                "shard order (a syncer writes its own to RUN_DIR/syncer.addr once it listens)",
            )
        out.append(a.strip())
    return out


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """A free port, the first of `count` consecutive free ones (a sharded syncer's)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if count == 1 or all(_bindable(host, base + i) for i in range(1, count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
