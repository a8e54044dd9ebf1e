"""Small client helpers: find a syncer's address, wait for it to answer, ask for its status,
check that it takes a learner's secret."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc

from atoll.errors import AuthError
from atoll.wire import atoll_pb2 as pb
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire.auth import call_metadata, open_channel


def refused(who: str, address: str, reason: str, run_id: str) -> AuthError:
    """The one line for a call the syncer refused (UNAUTHENTICATED: wire/auth.py's check)."""
    return AuthError(
        f"{who}: the syncer at {address} refused it ({reason}): give it the syncer's shared "
        f"secret (a secret file or the ATOLL_SECRET environment variable), run id (this one: "
        f"{run_id!r}) and atoll version"
    )


def check_secret(
    who: str,
    address: str,
    run_id: str,
    secret: str,
    tls_ca: str | None = None,
    timeout: float = 2.0,
) -> None:
    """One Status call to the syncer (the home shard of a sharded one): `refused` at once if it
    refuses the secret, run id or protocol; nothing if it answers, or cannot be reached (the
    learner's communication side then retries, and says so)."""
    try:
        status(address, run_id, secret, timeout, tls_ca)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise refused(who, address.split(",")[0], str(exc.details()), run_id) from None


def status(
    address: str, run_id: str, secret: str, timeout: float = 2.0, tls_ca: str | None = None
) -> pb.StatusReply:
    """The syncer's status; of a sharded syncer's addresses (comma-separated), the home
    shard's (the first: it counts the run's tokens and sets its start)."""
    with open_channel(address.split(",")[0], "control", tls_ca) as ch:
        return pbg.SyncerStub(ch).Status(
            pb.StatusRequest(), metadata=call_metadata(run_id, secret), timeout=timeout
        )


def syncer_address(
    run_dir: Path, timeout: float = 60.0, alive: Callable[[], bool] | None = None
) -> str | None:
    """The address an `atoll syncer --run-dir run_dir` writes there once it listens
    (`syncer.addr`); None if `alive()` says its process ended, or `timeout` seconds passed,
    first."""
    path = Path(run_dir) / "syncer.addr"
    until = time.monotonic() + timeout
    while not path.exists():
        if (alive is not None and not alive()) or time.monotonic() > until:
            return None
        time.sleep(0.05)
    return path.read_text().strip()


def write_address(run_dir: Path, addr: str) -> None:
    """RUN_DIR/syncer.addr, atomically (a temporary file renamed: a reader never sees half)."""
    tmp = Path(run_dir) / "syncer.addr.tmp"
    tmp.write_text(addr)
    tmp.replace(Path(run_dir) / "syncer.addr")


def wait_ready(
    address: str,
    run_id: str,
    secret: str,
    timeout: float = 60.0,
    tls_ca: str | None = None,
    alive: Callable[[], bool] | None = None,
) -> pb.StatusReply | None:
    """Poll Status until the syncer answers (every shard of a sharded one, comma-separated
    addresses; the home shard's status); raises TimeoutError after `timeout` seconds. None as
    soon as `alive()` says the syncer's process has ended."""
    until = time.time() + timeout
    last: Exception | None = None
    answers: list[pb.StatusReply] = []
    for a in address.split(","):
        while True:
            if alive is not None and not alive():
                return None
            try:
                answers.append(status(a, run_id, secret, 1.0, tls_ca))
                break
            except grpc.RpcError as exc:
                last = exc
                if time.time() >= until:
                    raise TimeoutError(
                        f"syncer at {a} did not answer within {timeout:.0f} s: {last}"
                    ) from None
                time.sleep(0.1)
    return answers[0]
