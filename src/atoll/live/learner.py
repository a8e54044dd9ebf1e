"""The learner library: Decoupled DiLoCo for any PyTorch training loop.

    learner = Learner(model, inner_optimizer, syncer="127.0.0.1:7070", learner_id="L0")
    for batch in data:
        loss = ...; loss.backward(); inner_optimizer.step(); inner_optimizer.zero_grad()
        learner.step(tokens=batch_tokens)   # never blocks on the network
        if learner.should_stop:
            break
    learner.finish()

`Learner` drives atoll.core.learner.LearnerProtocol. All protocol calls happen in the training
thread, inside `step()` (a step boundary); communication runs in background threads:
  - down: the Join stream (welcome, heal, broadcast updates), reassembled and crc-checked;
  - up: one Push stream per contribution (newest per fragment; optional token-bucket shaping);
  - beat: heartbeats on a separate channel (control traffic stays off the bulk path);
  - ctl: with the pull schedule (the default), a Control stream on that control channel: the
    learner's step reports (core Progress, batched every `progress_interval_s`) go up, the
    syncer's Pulls come down and are answered at the next step boundary (at once when the
    learner is waiting for an answer).
If the syncer goes away, the threads reconnect with exponential backoff (0.2 s doubling to 2 s,
with jitter) and *resume*: the learner keeps its local progress when the syncer still holds its
base versions, and heals (loads every global fragment) otherwise. The constructor blocks until
the first heal: a learner never trains from its own initialisation.

The inner optimizer is left alone (its state is kept across receipts, as in DiLoCo).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import random
import sys
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import torch

from atoll.core.fragments import Fragment, FragmentPlan
from atoll.core.learner import LearnerConfig, LearnerProtocol
from atoll.core.messages import Contribution, FragmentUpdate, Heal, Progress, Pull
from atoll.errors import ConfigError
from atoll.live.eventlog import EventLog
from atoll.wire import PROTOCOL
from atoll.wire import atoll_pb2 as pb
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire.auth import call_metadata, load_secret, open_channel
from atoll.wire.chunks import Assembler, TransferError, crc32, split


def _median_ms(xs: deque[float]) -> float | None:
    """Median of a few recent latencies, in ms (None if there are none)."""
    vals = sorted(list(xs))
    return round(1e3 * vals[len(vals) // 2], 3) if vals else None


class TokenBucket:
    """Limits a sender to `rate_bps` bits per second with a burst of `burst` bytes."""

    def __init__(self, rate_bps: float, burst: int = 64 * 1024) -> None:
        self.rate = rate_bps / 8.0  # bytes per second
        self.burst = float(burst)
        self.tokens = float(burst)
        self.t = time.monotonic()

    def take(self, nbytes: int) -> float:
        """Wait until `nbytes` may go; returns the seconds waited."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        self.tokens -= nbytes
        if self.tokens >= 0:
            return 0.0
        wait = -self.tokens / self.rate
        time.sleep(wait)
        return wait


@dataclass
class _Outgoing:
    c: Contribution
    work_s: float
    vector: torch.Tensor | None = None  # not yet encoded (payload empty until then)
    generation: int = 0


_PLACEHOLDER = b"atoll-deferred:"


class DeferredEncoder:
    """Stands in for the protocol's `codec.ErrorFeedback` so that the training thread does no
    quantizing or compressing: `encode` keeps the vector (base - theta, a fresh tensor the
    protocol computed at the step boundary, so the snapshot is consistent) and returns a
    placeholder; the up thread later calls `finish`, which encodes with the real error
    feedback in the order contributions actually go out. A heal (`reset()`) starts a new
    generation: vectors of an older one are dropped, not sent."""

    def __init__(self, scheme: str, group: int, enabled: bool) -> None:
        from atoll.core import codec

        self.real = codec.ErrorFeedback(scheme, group, enabled)
        self.generation = 0
        self._encoded_generation = 0
        self._jobs: dict[bytes, tuple[object, torch.Tensor, int]] = {}
        self._key_resets: set[object] = set()
        self._n = 0
        self._lock = threading.Lock()

    # -- the protocol's side (training thread) ------------------------------------------------
    def encode(self, key: object, x: torch.Tensor) -> bytes:
        self._n += 1
        token = _PLACEHOLDER + str(self._n).encode()
        with self._lock:
            self._jobs[token] = (key, x.detach().reshape(-1), self.generation)
        return token

    def reset(self, key: object | None = None) -> None:
        with self._lock:
            if key is None:
                self.generation += 1
                self._key_resets.clear()
            else:
                self._key_resets.add(key)

    # -- the driver's side --------------------------------------------------------------------
    def take(self, payload: bytes) -> tuple[torch.Tensor, int] | None:
        """(vector, generation) kept for a placeholder payload (training thread, at enqueue)."""
        with self._lock:
            job = self._jobs.pop(payload, None)
        return None if job is None else (job[1], job[2])

    def finish(self, key: object, vector: torch.Tensor, generation: int) -> bytes | None:
        """Encode a kept vector (up thread); None if a heal has made it obsolete."""
        with self._lock:
            if generation < self.generation:
                return None
            if generation > self._encoded_generation:
                self.real.reset()
                self._encoded_generation = generation
            if key in self._key_resets:
                self._key_resets.discard(key)
                self.real.reset(key)
        return self.real.encode(key, vector)


def plan_from_welcome(w: pb.Welcome) -> FragmentPlan:
    frags = tuple(
        Fragment(
            index=f.index,
            names=tuple(t.name for t in f.tensors),
            shapes=tuple(tuple(int(d) for d in t.shape) for t in f.tensors),
            offset=f.offset,
            is_embedding=f.is_embedding,
        )
        for f in w.fragments
    )
    return FragmentPlan(fragments=frags, H=w.H)


def check_params(plan: FragmentPlan, params: dict[str, torch.Tensor]) -> None:
    """The model must have exactly the syncer's tensors, with the same shapes."""
    want = {n: s for f in plan.fragments for n, s in zip(f.names, f.shapes, strict=True)}
    have = {n: tuple(p.shape) for n, p in params.items()}
    if set(want) != set(have):
        missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
        raise ConfigError(
            "model", f"missing {missing[:5]}, unknown {extra[:5]}", "the syncer's parameter names"
        )
    bad = [n for n in want if want[n] != have[n]]
    if bad:
        n = bad[0]
        raise ConfigError("model", f"{n} has shape {have[n]}", f"shape {want[n]} (syncer's)")


class Learner:
    def __init__(
        self,
        model: torch.nn.Module,
        inner_optimizer: torch.optim.Optimizer | None = None,
        syncer: str = "127.0.0.1:7070",
        *,
        learner_id: str | None = None,
        run_id: str = "atoll",
        secret: str | None = None,
        secret_file: str | None = None,
        tls_ca: str | None = None,
        wait_s: float = 0.0,
        shape_mbps: float = 0.0,
        heartbeat_s: float = 0.5,
        connect_timeout_s: float = 60.0,
        events: EventLog | str | None = None,
        switch_interval_s: float | None = 2e-4,
        progress_interval_s: float = 0.05,
    ) -> None:
        if ":" not in syncer:
            raise ConfigError("syncer", syncer, "host:port")
        if switch_interval_s is not None:
            # The communication threads run Python (protobuf, grpc's iterators); with the
            # default 5 ms GIL switch interval the training thread can wait that long each
            # time it comes back from a torch op. A short interval bounds that wait.
            sys.setswitchinterval(switch_interval_s)
        self.model = model
        self.optimizer = inner_optimizer
        self.address = syncer
        self.id = learner_id or f"learner-{uuid.uuid4().hex[:6]}"
        self.incarnation = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.run_id = run_id
        self.secret = secret if secret is not None else load_secret(secret_file)
        self.metadata = call_metadata(run_id, self.secret)
        self.wait_s = wait_s
        self.heartbeat_s = heartbeat_s
        self.progress_interval_s = progress_interval_s
        self.events = events if isinstance(events, EventLog) else EventLog(events)
        self.bucket = TokenBucket(shape_mbps * 1e6) if shape_mbps > 0 else None
        self.started = time.time()
        self.params = dict(model.named_parameters())
        # shared with the background threads
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._out: OrderedDict[int, _Outgoing] = OrderedDict()
        self._out_cv = threading.Condition()
        self._progress: deque[Progress] = deque(maxlen=4096)  # step reports not yet sent
        self._progress_ev = threading.Event()
        self._ctl_call: Any = None
        self.pulls = 0
        self.pull_latency_s: deque[float] = deque(maxlen=256)  # syncer's send -> our inbox
        self._connected = threading.Event()
        self._closing = threading.Event()
        self._stop_flag = threading.Event()
        self._force_heal = False
        self._epoch = ""
        self._versions: tuple[list[int], list[int]] | None = None
        self._join_call: Any = None
        self._lock = threading.Lock()
        self.chunk_bytes = 256 * 1024
        self.max_bytes = 1 << 30
        # counters (reported in heartbeats)
        self.steps_done = 0
        self.tokens_done = 0
        self.work_s = 0.0
        self.bytes_up = 0
        self.bytes_down = 0
        self.refused = 0
        self.reconnects = 0
        self._last_step_t = 0.0
        self._unsent: list[float] = []
        self._first_step_logged = False
        self._share: tuple[int, float] | None = None  # (tokens at last beat, our share left)

        self.bulk = open_channel(syncer, "bulk", tls_ca)
        self.control = open_channel(syncer, "control", tls_ca)
        self.bulk_stub = pbg.SyncerStub(self.bulk)
        self.control_stub = pbg.SyncerStub(self.control)
        self.proto: LearnerProtocol | None = None
        self._threads = [
            threading.Thread(target=self._down_loop, name="atoll-down", daemon=True),
            threading.Thread(target=self._up_loop, name="atoll-up", daemon=True),
            threading.Thread(target=self._beat_loop, name="atoll-beat", daemon=True),
            threading.Thread(target=self._control_loop, name="atoll-ctl", daemon=True),
        ]
        for t in self._threads:
            t.start()
        self._await_first_heal(connect_timeout_s)

    # -- start-up -----------------------------------------------------------------------------
    def _await_first_heal(self, timeout: float) -> None:
        deadline = time.time() + timeout
        welcome = None
        while time.time() < deadline:
            try:
                item = self.inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if item[0] == "welcome":
                welcome = item[1]
            elif item[0] == "fatal":
                self.close()
                raise ConnectionError(item[1])
            elif item[0] == "heal" and welcome is not None:
                plan = plan_from_welcome(welcome)
                check_params(plan, self.params)
                s = welcome.settings
                cfg = LearnerConfig(
                    tau=s.tau,
                    codec=s.codec,
                    group=s.group,
                    error_feedback=s.error_feedback,
                    receipt=s.receipt,
                    alpha=s.alpha,
                    block=True,
                    schedule=s.schedule or "push",
                )
                self.proto = LearnerProtocol(self.id, plan, self.params, cfg)
                # quantize + compress in the up thread, not at the step boundary
                self.encoder = DeferredEncoder(cfg.codec, cfg.group, cfg.error_feedback)
                self.proto.ef = self.encoder  # type: ignore[assignment]
                self._unsent = [0.0] * plan.P
                self._apply_heal(item[1])
                return
        self.close()
        raise TimeoutError(f"no heal from the syncer at {self.address} within {timeout:.0f} s")

    def _apply_heal(self, heal: Heal) -> None:
        assert self.proto is not None
        now = time.time()
        for e in self.proto.on_heal(now, heal):
            self.events.emit(
                e.kind, self.id, incarnation=self.incarnation, since_start_s=now - self.started
            )
        self._publish_versions()
        self._last_step_t = time.time()

    # -- the training thread ------------------------------------------------------------------
    @property
    def should_stop(self) -> bool:
        """The syncer says the run's token budget is spent."""
        if self._stop_flag.is_set():
            return True
        share = self._share
        return share is not None and self.tokens_done - share[0] >= share[1]

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def step(self, tokens: int) -> None:
        """Call after every inner optimizer step. Applies received global fragments (at this
        step boundary), queues the contributions now due, and returns; it does no network I/O."""
        proto = self.proto
        assert proto is not None, "learner is closed"
        now = time.time()
        dt = now - self._last_step_t
        self._last_step_t = now
        if not self._first_step_logged:
            self._first_step_logged = True
            self.events.emit(
                "training", self.id, incarnation=self.incarnation, since_start_s=now - self.started
            )
        self._drain()
        self.steps_done += 1
        self.tokens_done += tokens
        self.work_s += dt
        share = dt / proto.plan.P
        for p in range(proto.plan.P):
            self._unsent[p] += share
        self._enqueue(proto.on_step(now, tokens, dt))
        self._drain()
        proto.apply_due(now)
        if self.wait_s > 0 and proto.blocked():
            until = time.time() + self.wait_s
            while proto.blocked() and time.time() < until:
                try:
                    item = self.inbox.get(timeout=max(until - time.time(), 0.001))
                except queue.Empty:
                    break
                self._handle(item)
                self._enqueue(proto.take_pulled(time.time()))  # idle: answer pulls at once
                proto.apply_due(time.time())
        self._publish_versions()
        if self.steps_done % 50 == 0:
            self.events.emit(
                "step",
                self.id,
                incarnation=self.incarnation,
                step=self.steps_done,
                tokens=self.tokens_done,
                step_time=proto.step_time.value,
                pulls=self.pulls,
                pull_latency_ms=_median_ms(self.pull_latency_s),
            )

    def _enqueue(self, sends: list) -> None:
        for s in sends:
            if isinstance(s.message, Progress):
                self._progress.append(s.message)  # control path, batched by the ctl thread
                self._progress_ev.set()
                continue
            if not isinstance(s.message, Contribution):
                continue
            c: Contribution = s.message
            work = self._unsent[c.fragment]
            self._unsent[c.fragment] = 0.0
            job = self.encoder.take(c.payload)
            vector, gen = job if job is not None else (None, self.encoder.generation)
            with self._out_cv:
                old = self._out.pop(c.fragment, None)  # the newest send supersedes it
                self._out[c.fragment] = _Outgoing(
                    c, work + (old.work_s if old else 0.0), vector, gen
                )
                self._out_cv.notify()

    def _publish_versions(self) -> None:
        p = self.proto
        if p is not None:
            self._versions = (list(p.base_version), list(p.latest_version))

    def _drain(self) -> None:
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(item)

    def _handle(self, item: tuple) -> None:
        proto = self.proto
        assert proto is not None
        kind = item[0]
        if kind == "update":
            try:
                proto.on_update(time.time(), item[1])
            except ValueError as exc:  # a delta that does not chain: heal
                self.events.emit("heal_needed", self.id, reason=str(exc))
                self._request_heal()
        elif kind == "pull":
            self.pulls += 1
            proto.on_pull(time.time(), item[1])
        elif kind == "heal":
            self._apply_heal(item[1])
        elif kind == "refused":
            self.refused += 1
            self.events.emit("push_refused", self.id, fragment=item[1], reason=item[2])
            if item[3] == "heal":
                self._request_heal()

    def _request_heal(self) -> None:
        with self._lock:
            self._force_heal = True
            call = self._join_call
        if call is not None:
            call.cancel()

    def finish(self, timeout: float = 10.0) -> None:
        """Send every fragment's remaining work once, wait (bounded) for it to be merged, close."""
        proto = self.proto
        if proto is not None and proto.healed:
            now = time.time()
            self._drain()
            proto.pulled.clear()  # the final flush below sends every fragment with new work
            pending = [p for p in range(proto.plan.P) if self._unsent[p] > 0]
            self._enqueue(proto.send_now(now, pending))
            until = time.time() + timeout
            while time.time() < until and self._connected.is_set():
                self._drain()
                with self._out_cv:
                    queued = bool(self._out)
                if not queued and all(r.answered for r in proto.outstanding.values()):
                    break
                time.sleep(0.02)
            self._drain()
            proto.apply_due(time.time())
        self.beat_once()
        self.close()

    def beat_once(self) -> None:
        """Report the final counters (tokens, step-seconds) synchronously."""
        try:
            self.control_stub.Heartbeat(
                pb.Beat(
                    learner=self.id,
                    incarnation=self.incarnation,
                    step=self.steps_done,
                    tokens=self.tokens_done,
                    work_s=self.work_s,
                ),
                metadata=self.metadata,
                timeout=2.0,
            )
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self._closing.set()
        with self._out_cv:
            self._out_cv.notify_all()
        self._progress_ev.set()
        with self._lock:
            calls = (self._join_call, self._ctl_call)
        for call in calls:
            if call is not None:
                call.cancel()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2.0)
        self.bulk.close()
        self.control.close()

    def __enter__(self) -> Learner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- background: down ---------------------------------------------------------------------
    def _hello(self) -> pb.Hello:
        with self._lock:
            force = self._force_heal
            self._force_heal = False
        versions = self._versions
        resume = versions is not None and not force
        return pb.Hello(
            protocol=PROTOCOL,
            learner=self.id,
            incarnation=self.incarnation,
            resume=resume,
            base_versions=versions[0] if versions else [],
            latest_versions=versions[1] if versions else [],
            epoch=self._epoch if versions else "",
        )

    def _down_loop(self) -> None:
        backoff = 0.2
        while not self._closing.is_set():
            hello = self._hello()
            call = self.bulk_stub.Join(hello, metadata=self.metadata)
            with self._lock:
                self._join_call = call
            try:
                for msg in self._reassemble(call):
                    backoff = 0.2
                    self.inbox.put(msg)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION):
                    self.inbox.put(("fatal", f"syncer refused us: {exc.details()}"))
                    self.events.emit("refused_by_syncer", self.id, reason=str(exc.details()))
                    self._closing.set()
                    break
            except TransferError as exc:
                self.events.emit("transfer_error", self.id, error=str(exc))
            finally:
                self._connected.clear()
                with self._lock:
                    self._join_call = None
            if self._closing.is_set():
                break
            self.events.emit("disconnected", self.id, retry_in_s=round(backoff, 2))
            self._closing.wait(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, 2.0)

    def _reassemble(self, call: Any) -> Iterator[tuple]:
        """Down messages -> ("welcome", w) / ("update", u) / ("heal", Heal) inbox items."""
        header = None
        asm: Assembler | None = None
        heal_parts: list[FragmentUpdate] = []
        expect_heal = 0

        def finish_update() -> FragmentUpdate:
            assert header is not None and asm is not None
            payload = asm.payload()
            self.bytes_down += len(payload)
            return FragmentUpdate(
                header.fragment,
                header.version,
                header.kind,
                header.base_version,
                payload,
                tuple((i.learner, i.seq) for i in header.included),
                header.closed_at,
            )

        for msg in call:
            which = msg.WhichOneof("body")
            if which == "welcome":
                w = msg.welcome
                self._epoch = w.epoch
                self.chunk_bytes = w.chunk_bytes or self.chunk_bytes
                self.max_bytes = w.max_fragment_bytes or self.max_bytes
                expect_heal = len(w.fragments) if w.heal else 0
                heal_parts = []
                self._connected.set()
                if self.proto is not None:
                    self.reconnects += 1
                    self.events.emit("reconnected", self.id, heal=w.heal, epoch=w.epoch)
                yield ("welcome", w)
            elif which == "update":
                header = msg.update
                asm = Assembler(header.total_bytes, header.crc32, self.max_bytes)
                if asm.complete:
                    yield from self._completed(
                        finish_update(), header.heal, heal_parts, expect_heal
                    )
            elif which == "chunk":
                if asm is None:
                    raise TransferError("chunk without a header")
                asm.add(msg.chunk)
                if asm.complete:
                    u = finish_update()
                    asm = None
                    yield from self._completed(u, header.heal, heal_parts, expect_heal)
            elif which == "notice":
                if msg.notice.kind == "stop":
                    self._stop_flag.set()

    def _completed(self, u, heal, parts, expect):  # noqa: ANN001, ANN202
        if heal:
            parts.append(u)
            if len(parts) == expect:
                yield ("heal", Heal(tuple(parts)))
                parts.clear()
        else:
            yield ("update", u)

    # -- background: up -----------------------------------------------------------------------
    def _up_loop(self) -> None:
        while not self._closing.is_set():
            with self._out_cv:
                while not self._out and not self._closing.is_set():
                    self._out_cv.wait(0.5)
                if self._closing.is_set():
                    return
                _, item = self._out.popitem(last=False)
            if not self._connected.wait(0.5):
                self._requeue(item)
                continue
            if item.vector is not None:  # encode here, off the training thread
                payload = self.encoder.finish(item.c.fragment, item.vector, item.generation)
                if payload is None:
                    continue  # made obsolete by a heal
                item = _Outgoing(dataclasses.replace(item.c, payload=payload), item.work_s)
            timeout = 30.0 + len(item.c.payload) / 1e5
            try:
                if len(item.c.payload) <= self.chunk_bytes and self.bucket is None:
                    frames = self._up_frames(item.c, item.work_s)
                    header = next(frames).header
                    reply = self.bulk_stub.PushOne(
                        pb.Single(header=header, payload=item.c.payload),
                        metadata=self.metadata,
                        timeout=timeout,
                    )
                else:
                    reply = self.bulk_stub.Push(
                        self._up_frames(item.c, item.work_s),
                        metadata=self.metadata,
                        timeout=timeout,
                    )
            except grpc.RpcError as exc:
                self.events.emit(
                    "push_failed", self.id, fragment=item.c.fragment, error=str(exc.code())
                )
                self._requeue(item)
                self._closing.wait(0.2)
                continue
            if reply.accepted:
                self.bytes_up += len(item.c.payload)
            elif reply.action == "rejoin":
                self._requeue(item)
                self._closing.wait(0.2)
            else:
                self.inbox.put(("refused", item.c.fragment, reply.reason, reply.action))

    def _requeue(self, item: _Outgoing) -> None:
        with self._out_cv:
            if item.c.fragment not in self._out:  # a newer send of it supersedes this one
                self._out[item.c.fragment] = item
                self._out.move_to_end(item.c.fragment, last=False)

    def _up_frames(self, c: Contribution, work_s: float) -> Iterator[pb.Up]:
        yield pb.Up(
            header=pb.ContributionHeader(
                protocol=PROTOCOL,
                learner=c.learner,
                incarnation=self.incarnation,
                fragment=c.fragment,
                seq=c.seq,
                base_version=c.base_version,
                steps=c.steps,
                tokens=c.tokens,
                sent_at=c.sent_at,
                step_time=c.step_time,
                total_bytes=len(c.payload),
                crc32=crc32(c.payload),
                work_s=work_s,
            )
        )
        for chunk in split(c.payload, self.chunk_bytes):
            if self.bucket is not None:
                self.bucket.take(len(chunk))
            yield pb.Up(chunk=chunk)

    # -- background: control stream (pull schedule) ------------------------------------------
    def _control_loop(self) -> None:
        """Keeps the Control stream open while the schedule is "pull": step reports up, pulls
        down into the inbox (handled at the next step boundary)."""
        backoff = 0.2
        while not self._closing.is_set():
            proto = self.proto
            if proto is None or proto.cfg.schedule != "pull" or not self._connected.is_set():
                self._closing.wait(0.1 if proto is None else 0.2)
                continue
            ended = threading.Event()
            call = self.control_stub.Control(self._control_up(ended), metadata=self.metadata)
            with self._lock:
                self._ctl_call = call
            try:
                for msg in call:
                    backoff = 0.2
                    now = time.time()
                    for x in msg.pulls:
                        self.pull_latency_s.append(max(now - x.at, 0.0))
                        self.inbox.put(("pull", Pull(x.fragment, x.tick, x.at)))
            except grpc.RpcError:
                pass
            finally:
                ended.set()
                self._progress_ev.set()  # wake the request generator so it ends
                with self._lock:
                    self._ctl_call = None
            if self._closing.wait(backoff * random.uniform(0.8, 1.2)):
                break
            backoff = min(backoff * 2, 2.0)

    def _control_up(self, ended: threading.Event) -> Iterator[pb.ControlUp]:
        """Request side of the Control stream: a hello, then batches of step reports (it
        sleeps on an event between steps; at most one batch per `progress_interval_s`)."""
        yield pb.ControlUp(
            hello=pb.ControlHello(protocol=PROTOCOL, learner=self.id, incarnation=self.incarnation)
        )
        while not ended.is_set() and not self._closing.is_set():
            if not self._progress_ev.wait(1.0):
                continue
            self._progress_ev.clear()
            batch = []
            while self._progress:
                r = self._progress.popleft()
                batch.append(pb.StepReport(step=r.step, step_time=r.step_time, at=r.at))
            if batch and not ended.is_set():
                yield pb.ControlUp(progress=pb.ProgressBatch(steps=batch))
            if self.progress_interval_s > 0:
                ended.wait(self.progress_interval_s)

    # -- background: heartbeats ---------------------------------------------------------------
    def _beat_loop(self) -> None:
        while not self._closing.wait(self.heartbeat_s):
            if self.proto is None:
                continue
            beat_tokens = self.tokens_done
            try:
                reply = self.control_stub.Heartbeat(
                    pb.Beat(
                        learner=self.id,
                        incarnation=self.incarnation,
                        step=self.steps_done,
                        tokens=beat_tokens,
                        step_time=self.proto.step_time.value or 0.0,
                        work_s=self.work_s,
                    ),
                    metadata=self.metadata,
                    timeout=max(2.0, 4 * self.heartbeat_s),
                )
            except grpc.RpcError:
                continue
            if reply.stop:
                self._stop_flag.set()
            elif reply.budget:
                self._share = (beat_tokens, reply.remaining / max(reply.live, 1))
            if self._connected.is_set() and (not reply.known or reply.epoch != self._epoch):
                with self._lock:
                    call = self._join_call
                if call is not None:
                    call.cancel()
