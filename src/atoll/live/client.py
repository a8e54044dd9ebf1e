"""Small client helpers: find a syncer's address, wait for it to answer, ask for its status."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc

from atoll.wire import atoll_pb2 as pb
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire.auth import call_metadata, open_channel


def status(
    address: str, run_id: str, secret: str, timeout: float = 2.0, tls_ca: str | None = None
) -> pb.StatusReply:
    with open_channel(address, "control", tls_ca) as ch:
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


def wait_ready(
    address: str,
    run_id: str,
    secret: str,
    timeout: float = 60.0,
    tls_ca: str | None = None,
    alive: Callable[[], bool] | None = None,
) -> pb.StatusReply | None:
    """Poll Status until the syncer answers; raises TimeoutError after `timeout` seconds.
    None as soon as `alive()` says the syncer's process has ended."""
    until = time.time() + timeout
    last: Exception | None = None
    while time.time() < until:
        if alive is not None and not alive():
            return None
        try:
            return status(address, run_id, secret, 1.0, tls_ca)
        except grpc.RpcError as exc:
            last = exc
            time.sleep(0.1)
    raise TimeoutError(f"syncer at {address} did not answer within {timeout:.0f} s: {last}")
