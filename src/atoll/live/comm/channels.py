"""A learner's two gRPC channels to the syncer (bulk: Join and Push; control: heartbeats and
Pulls, a TCP connection of its own), their call metadata, and the open streaming calls, kept
under a lock so that another thread may end them."""

from __future__ import annotations

import threading
from typing import Any

from atoll.live.comm.messages import CommOptions
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire.auth import call_metadata, open_channel


class Channels:
    def __init__(self, opts: CommOptions) -> None:
        self.metadata = call_metadata(opts.run_id, opts.secret)
        self._lock = threading.Lock()  # the calls below and `_heal`
        self._join: Any = None
        self._ctl: Any = None
        self._heal = False  # the next Hello asks for a heal
        self.bulk = open_channel(opts.address, "bulk", opts.tls_ca)
        self.control = open_channel(opts.address, "control", opts.tls_ca)
        self.bulk_stub = pbg.SyncerStub(self.bulk)
        self.control_stub = pbg.SyncerStub(self.control)

    def set_join(self, call: Any) -> None:
        """The open Join stream (None: ended)."""
        with self._lock:
            self._join = call

    def set_pulls(self, call: Any) -> None:
        """The open Pulls stream (None: ended)."""
        with self._lock:
            self._ctl = call

    def cancel_join(self) -> None:
        """End the Join stream (the down thread then reconnects)."""
        with self._lock:
            call = self._join
        if call is not None:
            call.cancel()

    def request_heal(self) -> None:
        """Rejoin, asking for a heal."""
        with self._lock:
            self._heal = True
        self.cancel_join()

    def take_heal_request(self) -> bool:
        """Whether a heal was requested since the last Hello (cleared)."""
        with self._lock:
            heal, self._heal = self._heal, False
        return heal

    def cancel_calls(self) -> None:
        """End both streams."""
        with self._lock:
            calls = (self._join, self._ctl)
        for call in calls:
            if call is not None:
                call.cancel()

    def close(self) -> None:
        self.bulk.close()
        self.control.close()
