"""The learner's communication with the syncer: gRPC streams, encoding, heartbeats, reconnects.

`Comm` owns every background thread of a learner:
  - down: the Join stream on the bulk channel (welcome, heal, broadcast updates), reassembled
    and crc-checked;
  - up: contributions (newest per fragment), quantized + compressed *here* with the learner's
    error feedback (the training thread hands over a plain float32 copy), then one unary
    PushOne (one chunk) or a Push stream (optional token-bucket shaping);
  - beat: heartbeats on the control channel (a TCP connection of its own);
  - ctl: with the pull schedule, the Pulls stream on the control channel: the syncer's pulls
    down (the step reports that pace its pull clock go up in the heartbeats).
Reconnects use backoff 0.2 s doubling to 2 s with jitter.

It talks to the training side through `sink(item)` (everything the training thread must see:
welcome, heal, update, pull, refused, status, fatal) and `command(msg)` (what the training
thread hands over after each step). By default it runs in a child process of the learner
(`comm_main`, at nice +10 so that its wake-ups do not preempt the training thread; vectors
pass through shared slots, atoll.live.shm, and it sends no heartbeat while the training
process is stopped); `Learner(comm="thread")` runs it in threads of the learner's process.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import random
import signal
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from atoll.core import codec
from atoll.core.messages import Contribution, FragmentUpdate, Heal, Pull
from atoll.live.eventlog import EventLog
from atoll.live.shm import SharedSlots
from atoll.wire import PROTOCOL
from atoll.wire import atoll_pb2 as pb
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire.auth import call_metadata, open_channel
from atoll.wire.chunks import Assembler, TransferError, crc32, split


@dataclass(frozen=True)
class CommOptions:
    address: str
    learner_id: str
    incarnation: str
    run_id: str
    secret: str
    tls_ca: str | None = None
    shape_mbps: float = 0.0
    heartbeat_s: float = 0.5
    status_interval_s: float = 0.25  # queue and byte counters to the training side, at most
    events_path: str | None = None
    nice: int = 10  # child process only: added niceness (measured: fewer preemptions)
    parent_pid: int = 0  # child process only: the training process (no beats while stopped)


IN_SLOT = "in-slot"  # process mode: the vector is in its fragment's shared slot (atoll.live.shm)


@dataclass
class Submit:
    """A contribution handed over by the training thread. `vector` is base - theta (taken at
    the step boundary) still to be encoded, as a flat float32 numpy array (no copy) or raw
    float32 bytes; None: `c.payload` is final. Vectors of a `generation` older than the
    newest heal are dropped."""

    c: Contribution
    work_s: float
    vector: Any
    generation: int


@dataclass
class StepState:
    """Training -> comm after a step: counters for heartbeats (which also pace the syncer's
    pull clock), versions for a resuming Hello, and the contributions now due."""

    steps: int
    tokens: int
    work_s: float
    step_time: float
    base_versions: list[int]
    latest_versions: list[int]
    submits: list[Submit] = field(default_factory=list)


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


class Comm:
    def __init__(self, opts: CommOptions, sink: Callable[[tuple], None]) -> None:
        self.o = opts
        self.id = opts.learner_id
        self.sink = sink
        self.metadata = call_metadata(opts.run_id, opts.secret)
        self.events = EventLog(opts.events_path)
        self.bucket = TokenBucket(opts.shape_mbps * 1e6) if opts.shape_mbps > 0 else None
        self.chunk_bytes = 256 * 1024
        self.max_bytes = 1 << 30
        self.ef: codec.ErrorFeedback | None = None
        self.generation = 0  # newest heal the training side reported
        self._ef_generation = 0
        self.schedule = ""
        self._numel: dict[int, int] = {}  # fragment -> values (from the Welcome)
        self._out: OrderedDict[int, Submit] = OrderedDict()
        self._out_cv = threading.Condition()
        self._in_flight = 0
        self._received = 0  # submits handed over (the training side compares its count)
        self._connected = threading.Event()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._force_heal = False
        self._epoch = ""
        self._state: StepState | None = None
        self._join_call: Any = None
        self._ctl_call: Any = None
        self.bytes_up = 0
        self.reconnects = 0
        self._welcomed = False
        self._finishing = False
        # heartbeats carry the step reports that start the syncer's pull clock: the first
        # step after a (re)join, and the opening of the Pulls stream, are reported at once,
        # not up to `heartbeat_s` later
        self._beat_now = threading.Event()
        self._beat_steps = 1 << 62  # steps at the last (re)join; huge: nothing to report
        self._joins = 0  # welcomes received
        self._status_at = 0.0  # monotonic time of the last status item
        self._status_seq = 0
        self.bulk = open_channel(opts.address, "bulk", opts.tls_ca)
        self.control = open_channel(opts.address, "control", opts.tls_ca)
        self.bulk_stub = pbg.SyncerStub(self.bulk)
        self.control_stub = pbg.SyncerStub(self.control)
        self._threads = [
            threading.Thread(target=fn, name=f"atoll-{name}", daemon=True)
            for name, fn in (
                ("down", self._down_loop),
                ("up", self._up_loop),
                ("beat", self._beat_loop),
                ("ctl", self._control_loop),
            )
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    # -- commands from the training side ------------------------------------------------------
    def command(self, msg: tuple) -> bool:
        """Apply one command; False when it asks the comm to close."""
        kind = msg[0]
        if kind == "step":
            self._on_step(msg[1])
        elif kind == "reset":  # the learner healed: older vectors are obsolete
            with self._out_cv:
                self.generation = max(self.generation, msg[1])
                for p in [p for p, s in self._out.items() if s.generation < self.generation]:
                    del self._out[p]
        elif kind == "heal":
            self.request_heal()
        elif kind == "finishing":  # the training side waits for the queue to drain
            self._finishing = True
            self._status()
        elif kind == "beat_once":
            self.beat_once()
            self.sink(("beat_done",))
        elif kind == "close":
            return False
        return True

    def _on_step(self, st: StepState) -> None:
        self._state = st
        if st.steps > self._beat_steps:  # the first step since (re)joining: report it at once
            self._beat_steps = 1 << 62
            self._beat_now.set()
        if st.submits:
            with self._out_cv:
                for s in st.submits:
                    self._received += 1
                    old = self._out.pop(s.c.fragment, None)  # the newest send supersedes it
                    if old is not None:
                        s.work_s += old.work_s
                    self._out[s.c.fragment] = s
                self._out_cv.notify()

    def fragment_sizes(self) -> list[int]:
        """Values per fragment, in plan order (from the newest Welcome)."""
        return [self._numel[p] for p in sorted(self._numel)]

    def request_heal(self) -> None:
        with self._lock:
            self._force_heal = True
            call = self._join_call
        if call is not None:
            call.cancel()

    def _status(self, **extra: object) -> None:
        self._status_at = time.monotonic()
        with self._out_cv:  # numbered: items from different threads may overtake each other
            queued = len(self._out) + self._in_flight
            received = self._received
            self._status_seq += 1
            seq = self._status_seq
        self.sink(
            (
                "status",
                {
                    "connected": self._connected.is_set(),
                    "bytes_up": self.bytes_up,
                    "reconnects": self.reconnects,
                    "queued": queued,
                    "received": received,
                    "seq": seq,
                    **extra,
                },
            )
        )

    def close(self) -> None:
        self._closing.set()
        self._beat_now.set()
        with self._out_cv:
            self._out_cv.notify_all()
        with self._lock:
            calls = (self._join_call, self._ctl_call)
        for call in calls:
            if call is not None:
                call.cancel()
        for t in self._threads:
            if t is not threading.current_thread() and t.is_alive():
                t.join(timeout=2.0)
        self.bulk.close()
        self.control.close()

    def beat_once(self) -> None:
        """Report the final counters (tokens, step-seconds) synchronously."""
        st = self._state
        if st is None:
            return
        try:
            self.control_stub.Heartbeat(self._beat(st), metadata=self.metadata, timeout=2.0)
        except grpc.RpcError:
            pass

    # -- down ---------------------------------------------------------------------------------
    def _hello(self) -> pb.Hello:
        with self._lock:
            force = self._force_heal
            self._force_heal = False
        st = self._state
        resume = st is not None and not force
        return pb.Hello(
            protocol=PROTOCOL,
            learner=self.id,
            incarnation=self.o.incarnation,
            resume=resume,
            base_versions=st.base_versions if st else [],
            latest_versions=st.latest_versions if st else [],
            epoch=self._epoch if st else "",
        )

    def _down_loop(self) -> None:
        backoff = 0.2
        while not self._closing.is_set():
            call = self.bulk_stub.Join(self._hello(), metadata=self.metadata)
            with self._lock:
                self._join_call = call
            try:
                for msg in self._reassemble(call):
                    backoff = 0.2
                    if msg[0] == "update":  # decode here: the training thread gets a tensor
                        msg = ("update", msg[1], self._decode(msg[1]))
                    self.sink(msg)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION):
                    self.sink(("fatal", f"syncer refused us: {exc.details()}"))
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
            self._status()
            self.events.emit("disconnected", self.id, retry_in_s=round(backoff, 2))
            self._closing.wait(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, 2.0)

    def _decode(self, u: FragmentUpdate) -> torch.Tensor | None:
        """An update's payload as a flat float32 tensor; None when it does not decode (the
        training thread then decodes it again and handles the error as before)."""
        try:
            return codec.decode(u.payload, self._numel.get(u.fragment))
        except ValueError:
            return None

    def _reassemble(self, call: Any) -> Iterator[tuple]:
        """Down messages -> ("welcome", bytes) / ("update", u) / ("heal", Heal) items."""
        header = None
        asm: Assembler | None = None
        heal_parts: list[FragmentUpdate] = []
        expect_heal = 0

        def finish_update() -> FragmentUpdate:
            assert header is not None and asm is not None
            return FragmentUpdate(
                header.fragment,
                header.version,
                header.kind,
                header.base_version,
                asm.payload(),
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
                self.schedule = w.settings.schedule or "push"
                self._numel = {
                    f.index: sum(math.prod(t.shape) for t in f.tensors) for f in w.fragments
                }
                if self.ef is None:
                    s = w.settings
                    self.ef = codec.ErrorFeedback(s.codec, s.group, s.error_feedback)
                expect_heal = len(w.fragments) if w.heal else 0
                heal_parts = []
                self._connected.set()
                if self._welcomed:
                    self.reconnects += 1
                    self.events.emit("reconnected", self.id, heal=w.heal, epoch=w.epoch)
                self._welcomed = True
                self._joins += 1
                st = self._state
                self._beat_steps = st.steps if st is not None else 0
                self._status()
                yield ("welcome", w.SerializeToString())
            elif which == "update":
                header = msg.update
                asm = Assembler(header.total_bytes, header.crc32, self.max_bytes)
                if header.payload:  # inline: the whole payload, no chunks follow
                    asm.add(header.payload)
                if asm.complete:
                    yield from _completed(finish_update(), header.heal, heal_parts, expect_heal)
            elif which == "chunk":
                if asm is None:
                    raise TransferError("chunk without a header")
                asm.add(msg.chunk)
                if asm.complete:
                    u = finish_update()
                    asm = None
                    yield from _completed(u, header.heal, heal_parts, expect_heal)
            elif which == "notice":
                if msg.notice.kind == "stop":
                    self._status(stop=True)

    # -- up -----------------------------------------------------------------------------------
    def _encode(self, s: Submit) -> Submit | None:
        """Quantize + compress a handed-over vector (None if a heal made it obsolete)."""
        if s.vector is None:
            return s
        if s.generation < self.generation or self.ef is None:
            return None
        if s.generation > self._ef_generation:
            self.ef.reset()
            self._ef_generation = s.generation
        if isinstance(s.vector, np.ndarray):
            vec = torch.from_numpy(s.vector)
        else:
            vec = torch.frombuffer(bytearray(s.vector), dtype=torch.float32)
        payload = self.ef.encode(s.c.fragment, vec)
        return Submit(dataclasses.replace(s.c, payload=payload), s.work_s, None, s.generation)

    def _up_loop(self) -> None:
        while not self._closing.is_set():
            with self._out_cv:
                while not self._out and not self._closing.is_set():
                    self._out_cv.wait()
                if self._closing.is_set():
                    return
                _, item = self._out.popitem(last=False)
                self._in_flight = 1
            try:
                self._push(item)
            finally:
                with self._out_cv:
                    self._in_flight = 0
                # each status item costs the training thread a message to handle: one per
                # interval, or after every send while it waits for the queue to drain
                due = self._status_at + self.o.status_interval_s
                if self._finishing or time.monotonic() >= due:
                    self._status()

    def _push(self, raw: Submit) -> None:
        if not self._connected.wait(0.5):
            self._requeue(raw)
            return
        item = self._encode(raw)
        if item is None:
            return
        c = item.c
        timeout = 30.0 + len(c.payload) / 1e5
        try:
            if len(c.payload) <= self.chunk_bytes and self.bucket is None:
                header = next(self._up_frames(c, item.work_s)).header
                reply = self.bulk_stub.PushOne(
                    pb.Single(header=header, payload=c.payload),
                    metadata=self.metadata,
                    timeout=timeout,
                )
            else:
                reply = self.bulk_stub.Push(
                    self._up_frames(c, item.work_s), metadata=self.metadata, timeout=timeout
                )
        except grpc.RpcError as exc:
            self.events.emit("push_failed", self.id, fragment=c.fragment, error=str(exc.code()))
            self._requeue(item)
            self._closing.wait(0.2)
            return
        if reply.accepted:
            self.bytes_up += len(c.payload)
        elif reply.action == "rejoin":
            self._requeue(item)
            self._closing.wait(0.2)
        else:
            self.sink(("refused", c.fragment, reply.reason, reply.action))

    def _requeue(self, item: Submit) -> None:
        with self._out_cv:
            if item.c.fragment not in self._out:  # a newer send of it supersedes this one
                self._out[item.c.fragment] = item
                self._out.move_to_end(item.c.fragment, last=False)
                self._out_cv.notify()

    def _up_frames(self, c: Contribution, work_s: float) -> Iterator[pb.Up]:
        yield pb.Up(
            header=pb.ContributionHeader(
                protocol=PROTOCOL,
                learner=c.learner,
                incarnation=self.o.incarnation,
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

    # -- control stream (pull schedule) -------------------------------------------------------
    def _control_loop(self) -> None:
        """Keeps the Pulls stream open while the schedule is "pull" and hands each pull to the
        training side (handled there at the next step boundary). The stream is read by this
        thread itself (single-threaded unary-stream channel option): no extra wake-ups."""
        backoff = 0.2
        while not self._closing.is_set():
            if self.schedule != "pull":
                self._closing.wait(0.2)  # push: no Pulls stream (the schedule may change on rejoin)
                continue
            if not self._connected.wait(0.2):
                continue
            joins = self._joins
            hello = pb.ControlHello(
                protocol=PROTOCOL, learner=self.id, incarnation=self.o.incarnation
            )
            call = self.control_stub.Pulls(hello, metadata=self.metadata)
            with self._lock:
                self._ctl_call = call
            try:
                for msg in call:
                    if backoff > 0:  # the first message: the syncer registered the stream
                        backoff = 0.0
                        self._beat_now.set()  # report our steps now: it can pull us
                    now = time.time()
                    for x in msg.pulls:
                        self.sink(("pull", Pull(x.fragment, x.tick, x.at), now))
            except grpc.RpcError:
                pass
            finally:
                with self._lock:
                    self._ctl_call = None
            if self._joins != joins:  # the Join stream reconnected meanwhile: reopen at once
                backoff = 0.2
                continue
            backoff = min(max(backoff, 0.1) * 2, 2.0)
            if self._closing.wait(backoff * random.uniform(0.8, 1.2)):
                break

    # -- heartbeats ---------------------------------------------------------------------------
    def _beat(self, st) -> pb.Beat:
        """A heartbeat carrying the learner's counters from step state `st`."""
        return pb.Beat(
            learner=self.id,
            incarnation=self.o.incarnation,
            step=st.steps,
            tokens=st.tokens,
            step_time=st.step_time,
            work_s=st.work_s,
        )

    def _beat_loop(self) -> None:
        while not self._closing.is_set():
            if self._beat_now.wait(self.o.heartbeat_s):
                self._beat_now.clear()
            if self._closing.is_set():
                return
            st = self._state
            if st is None or (self.o.parent_pid and process_stopped(self.o.parent_pid)):
                continue  # a stopped training process is not alive, whatever this side does
            try:
                reply = self.control_stub.Heartbeat(
                    self._beat(st),
                    metadata=self.metadata,
                    timeout=max(2.0, 4 * self.o.heartbeat_s),
                )
            except grpc.RpcError:
                continue
            if reply.stop:
                self._status(stop=True)
            elif reply.budget:
                self._status(share=(st.tokens, reply.remaining / max(reply.live, 1)))
            if self._connected.is_set() and (not reply.known or reply.epoch != self._epoch):
                with self._lock:
                    call = self._join_call
                if call is not None:
                    call.cancel()


def process_stopped(pid: int) -> bool:
    """True while process `pid` is stopped (SIGSTOP, SIGTSTP, a debugger), from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :][:1] in ("T", "t")


def _completed(
    u: FragmentUpdate, heal: bool, parts: list[FragmentUpdate], expect: int
) -> Iterator[tuple]:
    if heal:
        parts.append(u)
        if len(parts) == expect:
            yield ("heal", Heal(tuple(parts)))
            parts.clear()
    else:
        yield ("update", u)


def comm_main(conn: Any, opts: CommOptions, slots: SharedSlots | None = None) -> None:
    """Child-process entry: run a `Comm`, commands from `conn`, items back over it (started
    by the learner as `python -m atoll.live.comm FD [SHM_FD TOTAL NFLAGS]`; the first message
    is the options). Vectors move through `slots` when given and free."""
    try:  # die with the learner process, even when it is SIGKILLed
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C goes to the learner; it closes us
    if opts.nice:
        os.nice(opts.nice)
    torch.set_num_threads(1)
    outbox: deque[tuple] = deque()
    writing = threading.Lock()

    def send(item: tuple) -> None:
        if item[0] == "welcome" and slots is not None:  # the fragment sizes, plan order
            slots.layout(comm.fragment_sizes())
        elif item[0] == "update" and item[2] is not None:
            u, value = item[1], item[2]
            if slots is not None and slots.put(slots.down, u.fragment, value):
                item = ("update", u, IN_SLOT)
            else:  # numpy pickles plainly; torch would not
                item = ("update", u, value.numpy())
        try:
            conn.send(item)
        except (BrokenPipeError, OSError):
            pass

    def sink(item: tuple) -> None:
        """Queue `item`; whichever thread finds the writer free sends everything queued, in
        order. A thread that finds it busy (a training process slow to read: a long step, a
        stop) leaves its item to the writing thread and goes on: heartbeats never wait on the
        socket. No thread of its own: one wake-up less per item."""
        outbox.append(item)
        while outbox and writing.acquire(blocking=False):
            try:
                while outbox:
                    send(outbox.popleft())
            finally:
                writing.release()

    comm = Comm(dataclasses.replace(opts, parent_pid=os.getppid()), sink)
    comm.start()
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "step" and slots is not None:  # take vectors out of their slots now
                for s in msg[1].submits:
                    if isinstance(s.vector, str) and s.vector == IN_SLOT:
                        s.vector = slots.take(slots.up, s.c.fragment).numpy()
            if not comm.command(msg):
                break
    except (EOFError, OSError):
        pass  # the learner process is gone
    finally:
        comm.close()


if __name__ == "__main__":
    import sys
    from multiprocessing.connection import Connection

    _conn = Connection(int(sys.argv[1]))
    _slots = None
    if len(sys.argv) > 4:
        _slots = SharedSlots(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    try:
        _first = _conn.recv()
    except (EOFError, OSError):
        sys.exit(0)
    comm_main(_conn, _first[1], _slots)
