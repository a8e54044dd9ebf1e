"""The learner library: Decoupled DiLoCo for any PyTorch training loop.

    learner = Learner(model, inner_optimizer, syncer="127.0.0.1:7070", learner_id="L0")
    for batch in data:
        loss = ...; loss.backward(); inner_optimizer.step(); inner_optimizer.zero_grad()
        learner.step(tokens=batch_tokens)   # never blocks on the network
        if learner.should_stop:
            break
    learner.finish()

`Learner` drives atoll.core.learner.LearnerProtocol. All protocol calls happen in the training
thread, inside `step()` (a step boundary). At that boundary the learner applies what arrived,
takes the contributions now due as plain float32 copies (base - theta: the snapshot is the
step boundary's), and hands them to the communication side (atoll.live.comm), which
quantizes, compresses and sends them. With `comm="process"` (what the default "auto" picks on
a machine with 2 or more cores) it runs in a child process
that the learner starts and that dies with it: the training process then has no background
Python thread competing for its GIL, and a step boundary costs one socket write, one read,
and copies through shared memory slots (atoll.live.shm). `comm="thread"` runs it in
background threads of this process instead: no second process, but those threads take the GIL
from the training loop at every message (measured: +4 to +5% per step of the built-in model
against +2.3% for the child process, one fragment sent per step; BENCHMARKS.md).

Schedules (the syncer's choice, sent in its Welcome): "pull" (default) - the learner's
heartbeats report its step count and step time, which pace the syncer's pull clock, and it
sends a fragment at the first step boundary after the syncer pulls it (at once when it is
waiting for an answer); "push" - it sends on its own step count.

If the syncer goes away, the communication side reconnects and *resumes*: the learner keeps
its local progress when the syncer still holds its base versions, and heals (loads every global
fragment) otherwise. The constructor blocks until the first heal: a learner never trains from
its own initialisation. The inner optimizer is left alone (its state is kept across receipts,
as in DiLoCo).
"""

from __future__ import annotations

import os
import pickle
import queue
import select
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import torch

from atoll.core.fragments import FlatFragments, Fragment, FragmentPlan
from atoll.core.learner import LearnerConfig, LearnerProtocol
from atoll.core.messages import Contribution, Heal
from atoll.errors import ConfigError
from atoll.live import shm
from atoll.live.comm import IN_SLOT, Comm, CommOptions, StepState, Submit
from atoll.live.config import resolve_comm
from atoll.live.eventlog import EventLog
from atoll.live.shm import SharedSlots
from atoll.wire import atoll_pb2 as pb
from atoll.wire.auth import load_secret

# shared slots hold 2 x 4 bytes per parameter; above this (2 GiB) vectors go in the messages
MAX_SLOT_VALUES = 1 << 28
_PLACEHOLDER = b"atoll-deferred:"


def _median_ms(xs: deque[float]) -> float | None:
    """Median of a few recent latencies, in ms (None if there are none)."""
    vals = sorted(xs)
    return round(1e3 * vals[len(vals) // 2], 3) if vals else None


class DeferredEncoder:
    """Stands in for the protocol's `codec.ErrorFeedback` so that the training thread does no
    quantizing or compressing: `encode` keeps the vector (base - theta, a fresh tensor the
    protocol computed at the step boundary, so the snapshot is consistent) and returns a
    placeholder; the learner hands the vector to the communication side, which encodes it with
    the real error feedback in the order contributions go out. `reset` (a heal) starts a new
    generation: vectors of an older one are dropped there, and its residuals start over. The
    core resets whole learners only; a one-fragment reset is treated as a whole reset."""

    def __init__(self) -> None:
        self.generation = 0
        self._jobs: dict[bytes, torch.Tensor] = {}
        self._n = 0

    def encode(self, key: object, x: torch.Tensor) -> bytes:
        self._n += 1
        token = _PLACEHOLDER + str(self._n).encode()
        if x.dtype != torch.float32 or x.dim() != 1 or x.requires_grad:
            x = x.detach().reshape(-1).float()
        self._jobs[token] = x
        return token

    def reset(self, key: object | None = None) -> None:
        self.generation += 1
        self._jobs.clear()

    def take(self, payload: bytes) -> torch.Tensor | None:
        """The vector kept for a placeholder payload (each is handed out once)."""
        return self._jobs.pop(payload, None)


class _ThreadPort:
    """The communication side in threads of this process."""

    def __init__(self, opts: CommOptions) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.comm = Comm(opts, self.inbox.put)
        self.comm.start()

    def send(self, msg: tuple) -> None:
        self.comm.command(msg)

    def layout(self, numels: list[int]) -> None:
        pass

    def vector_out(self, p: int, vec: torch.Tensor) -> Any:
        return vec.numpy()  # a fresh tensor's memory, shared with the comm thread: no copy

    def value_in(self, p: int, value: Any) -> torch.Tensor | None:
        return value

    def get_all(self) -> list[tuple]:
        out = []
        while (item := self.get(0.0)) is not None:
            out.append(item)
        return out

    def get(self, timeout: float) -> tuple | None:
        try:
            if timeout <= 0:
                return self.inbox.get_nowait()
            return self.inbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.comm.close()


def send_framed(sock: socket.socket, msg: object) -> None:
    """Write `msg` in multiprocessing.connection's framing (a 4-byte big-endian length, or -1
    and an 8-byte one, then the pickle), which the child reads with `Connection.recv`: one
    sendall for a small message."""
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    n = len(data)
    head = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    if n < 1 << 16:
        sock.sendall(head + data)
    else:  # no copy of a large pickle
        sock.sendall(head)
        sock.sendall(data)


class _ProcessPort:
    """The communication side in a child process (`python -m atoll.live.comm`, so the user's
    script is not imported again), over a socket pair read at step boundaries only. Vectors
    (contributions up, decoded updates down) go through shared slots (atoll.live.shm) when
    free, so that the messages themselves stay small."""

    def __init__(self, opts: CommOptions, total: int, nflags: int) -> None:
        import atoll

        self.slots: SharedSlots | None = None
        fds, shm_args = [], []
        if shm.available() and 0 < total <= MAX_SLOT_VALUES:
            self.slots, fd = SharedSlots.create(total, nflags)
            fds, shm_args = [fd], [str(fd), str(total), str(nflags)]
        ours, theirs = socket.socketpair()
        root = str(Path(atoll.__file__).resolve().parents[1])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "atoll.live.comm", str(theirs.fileno()), *shm_args],
            pass_fds=[theirs.fileno(), *fds],
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        for fd in fds:
            os.close(fd)  # the mapping stays
        # the child reads a multiprocessing Connection: a 4-byte length (or -1 and an 8-byte
        # one), then a pickle. We write that framing ourselves, one sendall per message (a
        # Connection builds a new pickler, copying the copyreg table, for every send), and read
        # it with non-blocking reads, so that a step boundary costs one recv for all that is
        # waiting (no poll/select per message)
        self.sock = ours
        self._buf = bytearray()
        self._ready: deque[tuple] = deque()  # parsed, not yet handed out (by `get`)
        self._chunk = bytearray(1 << 20)  # reused: a fresh 1 MiB bytes per recv costs ~25 us
        self.dead = False
        self.send(("options", opts))

    def send(self, msg: tuple) -> None:
        if self.dead:
            return
        try:
            send_framed(self.sock, msg)
        except (BrokenPipeError, OSError):
            self.dead = True

    def layout(self, numels: list[int]) -> None:
        if self.slots is not None and not self.slots.layout(numels):
            self.slots = None

    def vector_out(self, p: int, vec: torch.Tensor) -> Any:
        if self.slots is not None and self.slots.put(self.slots.up, p, vec):
            return IN_SLOT
        return vec.numpy()

    def value_in(self, p: int, value: Any) -> torch.Tensor | None:
        if isinstance(value, str) and value == IN_SLOT and self.slots is not None:
            return self.slots.take(self.slots.down, p)
        return None if value is None else torch.from_numpy(value)

    def _parse(self) -> tuple | None:
        buf = self._buf
        if len(buf) < 4:
            return None
        (n,) = struct.unpack_from("!i", buf)
        start = 4
        if n == -1:
            if len(buf) < 12:
                return None
            (n,) = struct.unpack_from("!Q", buf, 4)
            start = 12
        if len(buf) < start + n:
            return None
        msg = pickle.loads(buf[start : start + n])
        del buf[: start + n]
        return msg

    def _read(self) -> bool:
        """Append what is waiting on the socket; False when the child is gone."""
        chunk = self._chunk
        while True:
            try:
                n = self.sock.recv_into(chunk, len(chunk), socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if not n:
                return False
            self._buf += memoryview(chunk)[:n]
            if n < len(chunk):
                return True

    def get_all(self) -> list[tuple]:
        """Everything waiting now, with one read of the socket (then a "fatal" item once, if
        the child is gone)."""
        out = list(self._ready)
        self._ready.clear()
        if self.dead:
            return out
        alive = self._read()
        while (msg := self._parse()) is not None:
            out.append(msg)
        if not alive:
            self.dead = True
            out.append(("fatal", "the communication process ended"))
        return out

    def get(self, timeout: float) -> tuple | None:
        """The next item, waiting up to `timeout` seconds for one."""
        until = time.monotonic() + timeout
        while not self._ready:
            self._ready.extend(self.get_all())
            if self._ready or self.dead:
                break
            left = until - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                break
        return self._ready.popleft() if self._ready else None

    def close(self) -> None:
        self.send(("close",))
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(2.0)
        self.sock.close()


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
        comm: str = "auto",
        switch_interval_s: float | None = 2e-4,
    ) -> None:
        if ":" not in syncer:
            raise ConfigError("syncer", syncer, "host:port")
        comm = resolve_comm(comm, 1)  # "auto": a child process if this machine has 2+ cores
        if comm == "thread" and switch_interval_s is not None:
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
        self.wait_s = wait_s
        self.events = events if isinstance(events, EventLog) else EventLog(events)
        self.started = time.time()
        self.params = dict(model.named_parameters())
        self.encoder = DeferredEncoder()
        self.proto: LearnerProtocol | None = None
        # counters (the step ones are reported in heartbeats)
        self.steps_done = 0
        self.tokens_done = 0
        self.work_s = 0.0
        self.bytes_up = 0
        self.bytes_down = 0
        self.refused = 0
        self.reconnects = 0
        self.pulls = 0
        self.pull_latency_s: deque[float] = deque(maxlen=256)  # syncer's send -> comm side
        self._connected = False
        self._stop = False
        self._share: tuple[int, float] | None = None  # (tokens at last beat, our share left)
        self._submitted = 0
        self._comm_status: dict[str, Any] = {"queued": 0, "received": 0}
        self._submits: list[Submit] = []
        self._last_step_t = 0.0
        self._sent_at_work: list[float] = []  # work_s when each fragment was last sent
        self._first_step_logged = False
        opts = CommOptions(
            address=syncer,
            learner_id=self.id,
            incarnation=self.incarnation,
            run_id=run_id,
            secret=self.secret,
            tls_ca=tls_ca,
            shape_mbps=shape_mbps,
            heartbeat_s=heartbeat_s,
            events_path=str(self.events.path) if self.events.path else None,
        )
        self.port: _ThreadPort | _ProcessPort = (
            _ProcessPort(opts, sum(t.numel() for t in self.params.values()), len(self.params))
            if comm == "process"
            else _ThreadPort(opts)
        )
        self._await_first_heal(connect_timeout_s)

    # -- start-up -----------------------------------------------------------------------------
    def _await_first_heal(self, timeout: float) -> None:
        deadline = time.time() + timeout
        welcome = None
        while time.time() < deadline:
            item = self.port.get(0.2)
            if item is None:
                continue
            if item[0] == "welcome":
                welcome = pb.Welcome.FromString(item[1])
            elif item[0] == "fatal":
                self.close()
                raise ConnectionError(item[1])
            elif item[0] == "status":
                self._status(item[1])
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
                flat = FlatFragments(plan, self.params)  # one op per fragment taken or set
                self.proto = LearnerProtocol(self.id, plan, self.params, cfg, flat)
                self.port.layout([f.numel for f in plan.fragments])
                self.proto.ef = self.encoder  # type: ignore[assignment]
                self._sent_at_work = [0.0] * plan.P
                self._apply_heal(item[1])
                return
        self.close()
        raise TimeoutError(f"no heal from the syncer at {self.address} within {timeout:.0f} s")

    def _apply_heal(self, heal: Heal) -> None:
        assert self.proto is not None
        now = time.time()
        self.bytes_down += heal.nbytes
        for e in self.proto.on_heal(now, heal):  # resets the encoder: a new generation
            self.events.emit(
                e.kind, self.id, incarnation=self.incarnation, since_start_s=now - self.started
            )
        self.port.send(("reset", self.encoder.generation))
        self._flush()
        self._last_step_t = time.time()

    # -- the training thread ------------------------------------------------------------------
    @property
    def should_stop(self) -> bool:
        """The syncer says the run's token budget is spent."""
        if self._stop:
            return True
        share = self._share
        return share is not None and self.tokens_done - share[0] >= share[1]

    @property
    def connected(self) -> bool:
        return self._connected

    def step(self, tokens: int) -> None:
        """Call after every inner optimizer step. Applies received global fragments (at this
        step boundary), hands over the contributions now due, and returns; it does no network
        I/O and no encoding."""
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
        self._collect(proto.on_step(now, tokens, dt))
        proto.apply_due(now)
        self._flush()
        if self.wait_s > 0 and proto.blocked():
            until = time.time() + self.wait_s
            while proto.blocked() and time.time() < until:
                item = self.port.get(max(until - time.time(), 0.001))
                if item is None:
                    break
                self._handle(item)
                self._collect(proto.take_pulled(time.time()))  # idle: answer pulls at once
                proto.apply_due(time.time())
                self._flush()
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

    def _collect(self, sends: list) -> None:
        """Protocol outputs -> step reports and contributions for the communication side."""
        for s in sends:
            if not isinstance(s.message, Contribution):
                continue
            c: Contribution = s.message
            work = self._unsent(c.fragment)
            self._sent_at_work[c.fragment] = self.work_s
            vec = self.encoder.take(c.payload)
            raw = None if vec is None else self.port.vector_out(c.fragment, vec)
            self._submits.append(Submit(c, work, raw, self.encoder.generation))
            self._submitted += 1

    def _unsent(self, p: int) -> float:
        """Step-seconds of fragment p not yet sent (each step counts 1/P for each fragment)."""
        return (self.work_s - self._sent_at_work[p]) / len(self._sent_at_work)

    def _flush(self) -> None:
        """Hand this step's state over: one message to the communication side."""
        p = self.proto
        if p is None:
            return
        self.port.send(
            (
                "step",
                StepState(
                    steps=self.steps_done,
                    tokens=self.tokens_done,
                    work_s=self.work_s,
                    step_time=p.step_time.value or 0.0,
                    base_versions=list(p.base_version),
                    latest_versions=list(p.latest_version),
                    submits=self._submits,
                ),
            )
        )
        self._submits = []

    def _drain(self) -> None:
        for item in self.port.get_all():
            self._handle(item)

    def _status(self, st: dict[str, Any]) -> None:
        if st.get("stop"):
            self._stop = True
        if st.get("share") is not None:
            self._share = st["share"]
        if st.get("seq", 0) < self._comm_status.get("seq", 0):
            return  # an older snapshot that overtook a newer one: keep the newer counters
        self._comm_status = st
        self._connected = bool(st.get("connected"))
        self.bytes_up = int(st.get("bytes_up", self.bytes_up))
        self.reconnects = int(st.get("reconnects", self.reconnects))

    def _handle(self, item: tuple) -> None:
        proto = self.proto
        assert proto is not None
        kind = item[0]
        if kind == "update":
            self.bytes_down += len(item[1].payload)
            # decoded by the communication side (from the child: in a slot or an array)
            value = self.port.value_in(item[1].fragment, item[2] if len(item) > 2 else None)
            try:
                proto.on_update(time.time(), item[1], value)
            except ValueError as exc:  # a delta that does not chain: heal
                self.events.emit("heal_needed", self.id, reason=str(exc))
                self.port.send(("heal",))
        elif kind == "pull":
            self.pulls += 1
            self.pull_latency_s.append(max(item[2] - item[1].at, 0.0))
            proto.on_pull(time.time(), item[1])
        elif kind == "status":
            self._status(item[1])
        elif kind == "heal":
            self._apply_heal(item[1])
        elif kind == "refused":
            self.refused += 1
            self.events.emit("push_refused", self.id, fragment=item[1], reason=item[2])
            if item[3] == "heal":
                self.port.send(("heal",))
        elif kind == "fatal":
            self.events.emit("comm_fatal", self.id, reason=item[1])

    def _queued(self) -> bool:
        st = self._comm_status
        return int(st.get("received", 0)) < self._submitted or int(st.get("queued", 0)) > 0

    def finish(self, timeout: float = 10.0) -> None:
        """Send every fragment's remaining work once, wait (bounded) for it to be merged, close."""
        proto = self.proto
        if proto is not None and proto.healed:
            now = time.time()
            self._drain()
            proto.pulled.clear()  # the final flush below sends every fragment with new work
            pending = [p for p in range(proto.plan.P) if self._unsent(p) > 0]
            self._collect(proto.send_now(now, pending))
            self._flush()
            self.port.send(("finishing",))  # report the send queue after every send from now
            until = time.time() + timeout
            while time.time() < until and self._connected:
                item = self.port.get(0.02)
                if item is not None:
                    self._handle(item)
                    self._drain()
                if not self._queued() and all(r.answered for r in proto.outstanding.values()):
                    break
            self._drain()
            proto.apply_due(time.time())
            self._flush()
        self.beat_once()
        self.close()

    def beat_once(self, timeout: float = 3.0) -> None:
        """Report the final counters (tokens, step-seconds) synchronously."""
        self._flush()
        self.port.send(("beat_once",))
        until = time.time() + timeout
        while time.time() < until:
            item = self.port.get(max(until - time.time(), 0.001))
            if item is None or item[0] == "beat_done":
                return
            if self.proto is not None:
                self._handle(item)

    def close(self) -> None:
        port = getattr(self, "port", None)
        if port is not None:
            port.close()
            self.port = _Closed()

    def __enter__(self) -> Learner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Closed:
    """The port of a closed learner: sends nothing, receives nothing."""

    def send(self, msg: tuple) -> None:
        pass

    def get(self, timeout: float) -> tuple | None:
        return None

    def get_all(self) -> list[tuple]:
        return []

    def close(self) -> None:
        pass
