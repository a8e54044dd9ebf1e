"""The live syncer service: the runtime (atoll.live.syncer.runtime) behind a gRPC server
with the run's authentication (atoll.wire.auth) and optional TLS."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import torch

from atoll.core.events import AuthRefused, SyncerStarted
from atoll.core.fragments import FragmentPlan
from atoll.core.learner import LearnerConfig
from atoll.core.syncer import SyncerConfig
from atoll.errors import ConfigError
from atoll.eventlog import EventLog
from atoll.live.syncer.handlers import Handlers
from atoll.live.syncer.limits import FdLimit, raise_fd_limit, server_options, workers
from atoll.live.syncer.runtime import SyncerOptions, SyncerRuntime
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire import convert
from atoll.wire.auth import AuthInterceptor, server_credentials


class SyncerService:
    """A syncer of a live run: `start()` listens and returns the port, `stop()` ends the run
    (closes every open round, snapshots, writes `final.safetensors`)."""

    def __init__(
        self,
        plan: FragmentPlan,
        init: list[torch.Tensor],
        syncer_cfg: SyncerConfig,
        learner_cfg: LearnerConfig,
        opts: SyncerOptions,
        events: EventLog | None = None,
    ) -> None:
        if not syncer_cfg.codec:  # contributions must come in the codec the learners are told
            syncer_cfg = dataclasses.replace(syncer_cfg, codec=learner_cfg.codec)
        self.runtime = SyncerRuntime(plan, init, syncer_cfg, opts, events)
        self.opts = opts
        max_bytes = opts.max_fragment_bytes or max(4 * f.numel + 4096 for f in plan.fragments)
        welcome = convert.welcome(plan, learner_cfg, "", False, opts.chunk_bytes, max_bytes)
        welcome.shard, welcome.shards = opts.shard.index, opts.shard.count
        welcome.served.extend(self.runtime.proto.served)
        self.handlers = Handlers(self.runtime, welcome)
        self.auth = AuthInterceptor(opts.run_id, opts.secret, self._auth_refused)
        self.server: grpc.Server | None = None
        self.port = 0
        self.fd_limit: FdLimit | None = None  # set by start()
        self._auth_lock = threading.Lock()
        self._auth_unwritten, self._auth_written_at = 0, -1.0

    @property
    def proto(self):  # the protocol, for tests and the final report (take `lock` to read)
        return self.runtime.proto

    @property
    def lock(self):
        return self.runtime.lock

    def _auth_refused(self, method: str, reason: str) -> None:
        """Counted every time; written at most once a second (with the count since the last
        one written), the method name cut to 100 characters: refused calls cannot fill the
        disk."""
        now = time.monotonic()
        with self._auth_lock:
            self._auth_unwritten += 1
            if now - self._auth_written_at < 1.0:
                return
            count, self._auth_unwritten, self._auth_written_at = self._auth_unwritten, 0, now
        self.runtime.record(AuthRefused(method=method[:100], reason=reason, count=count))

    def start(self) -> int:
        self.fd_limit = fd = raise_fd_limit()
        self.server = grpc.server(
            ThreadPoolExecutor(max_workers=workers(self.opts.max_learners)),
            interceptors=[self.auth],
            options=server_options(fd.soft),
        )
        pbg.add_SyncerServicer_to_server(self.handlers, self.server)
        addr = f"{self.opts.host}:{self.opts.port}"
        creds = server_credentials(self.opts.tls_cert, self.opts.tls_key)
        try:
            if creds is None:
                self.port = self.server.add_insecure_port(addr)
            else:
                self.port = self.server.add_secure_port(addr, creds)
        except RuntimeError:  # grpc's "Failed to bind": a port in use, a host not ours
            self.port = 0
        if self.port == 0:
            raise ConfigError(
                "host:port",
                addr,
                "an address of this host and a port no other process listens on (port=0: any "
                "free one)",
            )
        self.server.start()
        self.runtime.start_threads()
        rt = self.runtime
        started = SyncerStarted(
            port=self.port,
            epoch=rt.epoch,
            restored=rt.restored.found,
            fd_limit=fd.soft,
            fd_limit_before=fd.before,
            fd_limit_hard=fd.hard,
        )
        rt.events.record("syncer", started)
        return self.port

    def snapshot(self) -> None:
        self.runtime.snapshot()

    def stop(self, final_dir: Path | None = None) -> None:
        with self._auth_lock:
            count, self._auth_unwritten = self._auth_unwritten, 0
        if count:
            self.runtime.record(AuthRefused(method="", reason="(not written)", count=count))
        self.runtime.close_streams()
        if self.server is not None:
            self.server.stop(grace=1.0).wait(3.0)
        self.runtime.finish(final_dir)

    def final_accounts(self) -> dict:
        """The books at the end, with the rounds and versions (syncer_final.json)."""
        rt = self.runtime
        with rt.lock:
            final = rt.books.final(rt.proto.rounds_closed, rt.opts.expect_learners)
            return {**rt.acct, **final, "versions": list(rt.proto.version)}
