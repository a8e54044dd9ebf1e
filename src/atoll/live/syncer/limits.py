"""What the syncer's server lets a connection hold before it has shown the run's secret.

The secret is checked per call (atoll.wire.auth), so a TCP connection that never makes a call
is anonymous: all it can hold is one descriptor, and for a bounded time. The limits:

- descriptors: the soft limit is raised to the hard one at start (often 1,024 of 524,288);
  one source address can hold at most ~28,000 connections to one port (its ephemeral ports);
- accepted connections: at most the descriptor limit less `FILE_RESERVE`, so a flood is
  refused at the door (closed at once) and never takes the descriptors the tape, snapshots
  and event log need (a tape write that fails ends the syncer);
- a connection that has not finished its TCP/TLS/HTTP-2 handshake in `HANDSHAKE_S` is closed;
- one that holds no call for `IDLE_S` is closed (a learner's two connections always hold a
  stream: Join on one, Pulls on the other); one that does not answer keepalive pings is closed
  after 10 + 5 s;
- streams per connection: at most `STREAMS_PER_CONNECTION`; a call without the secret is
  refused before any handler runs, so it holds a server thread for microseconds;
- server threads: `workers(max_learners)`, 3 per learner (Join, Pulls and one short call)
  plus `SPARE_WORKERS`; sessions and Pulls streams are capped at `max_learners` each, so
  short calls always find a thread.

Nothing here cuts a long-lived stream: there is no maximum connection age.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from atoll.wire.auth import KEEPALIVE, MESSAGE_LIMITS

HANDSHAKE_S = 3.0
IDLE_S = 20.0
STREAMS_PER_CONNECTION = 64
FILE_RESERVE = 256  # descriptors kept for files (tape, snapshots, events) and gRPC's own
SPARE_WORKERS = 16


@dataclass(frozen=True)
class FdLimit:
    before: int  # the soft limit found at start
    soft: int  # the soft limit now
    hard: int

    @property
    def raised(self) -> bool:
        return self.soft > self.before


def _finite(n: int) -> int:
    return 1 << 20 if n == resource.RLIM_INFINITY else n


def raise_fd_limit() -> FdLimit:
    """The soft limit on open descriptors up to the hard one, where the system allows it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = soft
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return FdLimit(_finite(before), _finite(soft), _finite(hard))


def max_connections(fd_soft: int) -> int:
    return max(64, fd_soft - FILE_RESERVE)


def workers(max_learners: int) -> int:
    return 3 * max_learners + SPARE_WORKERS


def server_options(fd_soft: int) -> list[tuple[str, object]]:
    return [
        ("grpc.so_reuseport", 0),
        *KEEPALIVE,
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        *MESSAGE_LIMITS,
        ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_S * 1000)),
        ("grpc.max_connection_idle_ms", int(IDLE_S * 1000)),
        ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION),
        ("grpc.max_allowed_incoming_connections", max_connections(fd_soft)),
    ]
