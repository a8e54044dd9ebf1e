"""The live syncer: a wall-clock, gRPC driver around atoll.core.syncer.SyncerProtocol.

Threads: gRPC handlers (Join streams, Push streams, Heartbeat, Status, Pulls streams), a
timer thread that fires the protocol's SetTimer outputs (grace windows, the pull clock), a
reaper that declares silent learners lost, and a snapshot thread. Every protocol call happens
under one lock.

Pull schedule: each learner keeps a Pulls stream open on its control channel (a TCP
connection of its own, so nothing waits behind fragment data); the protocol's
`Send(learner, Pull)` outputs go down it at once. Its step reports (step count and step time)
come in its heartbeats and go to `on_progress` when the step count has moved.

A contribution reaches `on_contribution` only after its chunks were fully received, the size
and crc32 checked and the codec frame's scheme and size matched; a stream cut in the middle is
dropped whole. A committed merge is appended to the tape *before* its update is queued to any
learner. Learners that reconnect with `resume` keep their local progress when the syncer still
holds their base versions; otherwise they heal (get every fragment in full).
"""

from __future__ import annotations

import heapq
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import torch

from atoll.core import codec
from atoll.core.events import Event
from atoll.core.fragments import FragmentPlan
from atoll.core.learner import LearnerConfig
from atoll.core.messages import Contribution, FragmentUpdate, Progress, Pull, Send, SetTimer
from atoll.core.syncer import SyncerConfig, SyncerProtocol
from atoll.live.eventlog import EventLog
from atoll.live.store import Restored, Tape, commit_record, restore, write_snapshot
from atoll.wire import PROTOCOL
from atoll.wire import atoll_pb2 as pb
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire.auth import AuthInterceptor, server_credentials
from atoll.wire.chunks import Assembler, TransferError, crc32, split


@dataclass
class SyncerOptions:
    run_dir: Path
    run_id: str
    secret: str
    host: str = "127.0.0.1"
    port: int = 0
    chunk_bytes: int = 256 * 1024
    lost_after_s: float = 3.0
    snapshot_every_s: float = 10.0
    snapshot_history: int = 8
    tape_fsync: bool = False
    token_budget: int = 0  # 0: no budget (run until stopped)
    tls_cert: str | None = None
    tls_key: str | None = None
    max_fragment_bytes: int = 0  # 0: derived from the plan
    expect_learners: int = 0  # start_at is set once this many learners have joined


@dataclass
class _Session:
    learner: str
    incarnation: str
    last_seen: float
    cond: threading.Condition = field(default_factory=threading.Condition)
    updates: OrderedDict[int, FragmentUpdate] = field(default_factory=OrderedDict)
    notices: list[tuple[str, str]] = field(default_factory=list)
    closed: bool = False
    reported_step: int = 0  # the step count of its last heartbeat that reached on_progress
    reported_work_s: float = 0.0  # and its step-seconds then

    def put_update(self, u: FragmentUpdate, full: FragmentUpdate | None) -> None:
        """Queue an update; a queued, unsent update of the same fragment is superseded (kept
        in full when deltas would no longer chain), its `included` list carried over."""
        with self.cond:
            old = self.updates.pop(u.fragment, None)
            if old is not None:
                base = full if (u.kind == "delta" and full is not None) else u
                u = FragmentUpdate(
                    base.fragment,
                    base.version,
                    base.kind,
                    base.base_version,
                    base.payload,
                    tuple(dict.fromkeys(old.included + u.included)),
                    base.closed_at,
                )
            self.updates[u.fragment] = u
            self.cond.notify()

    def put_notice(self, kind: str, text: str) -> None:
        with self.cond:
            self.notices.append((kind, text))
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()

    def get(self, timeout: float) -> FragmentUpdate | tuple[str, str] | None:
        with self.cond:
            if not (self.updates or self.notices or self.closed):
                self.cond.wait(timeout)
            if self.notices:
                return self.notices.pop(0)
            if self.updates:
                return self.updates.popitem(last=False)[1]
            return None


@dataclass
class _Control:
    """One learner's Pulls stream: pulls waiting to go down it."""

    learner: str
    incarnation: str
    cond: threading.Condition = field(default_factory=threading.Condition)
    pulls: list[Pull] = field(default_factory=list)
    closed: bool = False

    def put(self, pull: Pull) -> None:
        with self.cond:
            self.pulls.append(pull)
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()

    def get(self, timeout: float) -> list[Pull]:
        with self.cond:
            if not (self.pulls or self.closed):
                self.cond.wait(timeout)
            out, self.pulls = self.pulls, []
            return out


def _check_hello(h: pb.Hello | pb.ControlHello, context: grpc.ServicerContext) -> None:
    """Refuse a stream opened by another protocol version or without a learner identity."""
    if h.protocol != PROTOCOL:
        context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"learner speaks protocol {h.protocol}, this syncer {PROTOCOL}",
        )
    if not h.learner or not h.incarnation:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "learner and incarnation are required")


class SyncerService(pbg.SyncerServicer):
    def __init__(
        self,
        plan: FragmentPlan,
        init: list[torch.Tensor],
        syncer_cfg: SyncerConfig,
        learner_cfg: LearnerConfig,
        opts: SyncerOptions,
        events: EventLog | None = None,
    ) -> None:
        self.plan, self.opts = plan, opts
        self.lcfg = learner_cfg
        self.proto = SyncerProtocol(plan, init, syncer_cfg)
        self.events = events or EventLog(opts.run_dir / "events.jsonl")
        self.lock = threading.RLock()
        self.epoch = uuid.uuid4().hex[:12]
        self.sessions: dict[str, _Session] = {}
        self.controls: dict[str, _Control] = {}
        self.timers: list[tuple[float, int, tuple]] = []
        self._timer_seq = 0
        self._timer_cv = threading.Condition(self.lock)
        self.stopping = threading.Event()
        self.max_bytes = opts.max_fragment_bytes or max(4 * f.numel + 4096 for f in plan.fragments)
        # accounting (persisted with the tape and the snapshots)
        self.acct: dict[str, Any] = {
            "start": time.time(),
            "tokens": {},  # "learner/incarnation" -> tokens trained
            "work_s": {},  # "learner/incarnation" -> step-seconds computed
            "useful_s": 0.0,
            "bytes_in": 0,
            "bytes_out": 0,
            "accepted": 0,
            "refused": 0,
            "broken_transfers": 0,
            "auth_refused": 0,
            "restarts": 0,
            "lost_committed_rounds": 0,
            "start_at": 0.0,
        }
        self.auth = AuthInterceptor(opts.run_id, opts.secret, self._auth_refused)
        self.tape = Tape(opts.run_dir / "tape", fsync=opts.tape_fsync)
        self.snapshot_path = opts.run_dir / "snapshot.safetensors"
        self.restored = self._restore()
        self.restored_versions = list(self.proto.version)
        self.max_seen = [-1] * plan.P
        self._prev_snapshot_seq = self.restored.snapshot_seq
        self.tape.open_segment(self.tape.next_seq)
        self.server: grpc.Server | None = None
        self.port = 0
        self._threads: list[threading.Thread] = []

    # -- durability ---------------------------------------------------------------------------
    def _restore(self) -> Restored:
        r = restore(self.proto, self.snapshot_path, self.tape)
        if r.found:
            self.acct.update(r.extra)
            self.acct["restarts"] = int(self.acct.get("restarts", 0)) + 1
            self.acct["lost_committed_rounds"] = (
                int(self.acct.get("lost_committed_rounds", 0)) + r.lost_committed_rounds
            )
            self.events.emit(
                "restored",
                "syncer",
                snapshot_records=r.snapshot_seq,
                replayed=r.replayed,
                rounds_closed=self.proto.rounds_closed,
                versions=list(self.proto.version),
                lost_committed_rounds=r.lost_committed_rounds,
            )
        return r

    def snapshot(self) -> None:
        with self.lock:
            seq = self.tape.next_seq
            proto_copy = _Frozen(self.proto, self.opts.snapshot_history)
            extra = dict(self.acct)
            self.tape.open_segment(seq)
        write_snapshot(self.snapshot_path, proto_copy, seq, extra, self.opts.snapshot_history)
        self.tape.drop_before(self._prev_snapshot_seq)
        self._prev_snapshot_seq = seq
        self.events.emit("snapshot", "syncer", tape_next=seq, rounds=proto_copy.rounds_closed)

    # -- protocol outputs ---------------------------------------------------------------------
    def _process(self, now: float, outputs: list) -> None:
        """Handle protocol outputs (lock held): tape first, then queue, timers, events."""
        for o in outputs:
            if isinstance(o, Event) and o.kind == "round_closed":
                self.tape.append(
                    commit_record(self.proto, self.tape.next_seq, o.data["fragment"], self.acct)
                )
        for o in outputs:
            if isinstance(o, Event):
                self.events.write(o)
            elif isinstance(o, SetTimer):
                self._timer_seq += 1
                heapq.heappush(self.timers, (o.at, self._timer_seq, o.key))
                self._timer_cv.notify()
            elif isinstance(o, Send) and isinstance(o.message, FragmentUpdate):
                sess = self.sessions.get(o.to)
                if sess is not None:
                    u = o.message
                    full = None
                    if u.kind == "delta":
                        p = u.fragment
                        full = FragmentUpdate(
                            p,
                            u.version,
                            "full",
                            u.base_version,
                            codec.encode(self.proto.public[p], "fp32"),
                            u.included,
                            u.closed_at,
                        )
                    sess.put_update(u, full)
            elif isinstance(o, Send) and isinstance(o.message, Pull):
                sess, ctl = self.sessions.get(o.to), self.controls.get(o.to)
                if sess is not None and ctl is not None and ctl.incarnation == sess.incarnation:
                    ctl.put(o.message)

    def _auth_refused(self, method: str, reason: str) -> None:
        self.acct["auth_refused"] = int(self.acct.get("auth_refused", 0)) + 1
        self.events.emit("auth_refused", "syncer", method=method, reason=reason)

    def _lose(self, learner: str, sess: _Session, why: str) -> None:
        with self.lock:
            sess.close()
            if self.sessions.get(learner) is sess:
                del self.sessions[learner]
                now = time.time()
                self._process(now, self.proto.on_lost(now, learner))
                self.events.emit("learner_lost", "syncer", learner=learner, why=why)

    @property
    def stop_requested(self) -> bool:
        b = self.opts.token_budget
        return b > 0 and self.total_tokens() >= b

    def total_tokens(self) -> int:
        return int(sum(self.acct["tokens"].values()))

    # -- RPCs ---------------------------------------------------------------------------------
    def _welcome(self, heal: bool) -> pb.Welcome:
        frags = [
            pb.FragmentSpec(
                index=f.index,
                tensors=[
                    pb.TensorSpec(name=n, shape=list(s))
                    for n, s in zip(f.names, f.shapes, strict=True)
                ],
                offset=f.offset,
                is_embedding=f.is_embedding,
            )
            for f in self.plan.fragments
        ]
        c = self.lcfg
        return pb.Welcome(
            protocol=PROTOCOL,
            epoch=self.epoch,
            H=self.plan.H,
            fragments=frags,
            settings=pb.LearnerSettings(
                tau=c.tau,
                codec=c.codec,
                group=c.group,
                error_feedback=c.error_feedback,
                receipt=c.receipt,
                alpha=c.alpha,
                schedule=c.schedule,
            ),
            heal=heal,
            chunk_bytes=self.opts.chunk_bytes,
            max_fragment_bytes=self.max_bytes,
        )

    def _frames(self, u: FragmentUpdate, heal: bool = False) -> Iterator[pb.Down]:
        inline = len(u.payload) <= self.opts.chunk_bytes  # one message instead of two
        yield pb.Down(
            update=pb.UpdateHeader(
                fragment=u.fragment,
                version=u.version,
                kind=u.kind,
                base_version=u.base_version,
                included=[pb.Included(learner=lid, seq=s) for lid, s in u.included],
                closed_at=u.closed_at,
                total_bytes=len(u.payload),
                crc32=crc32(u.payload),
                heal=heal,
                payload=u.payload if inline else b"",
            )
        )
        for chunk in [] if inline else split(u.payload, self.opts.chunk_bytes):
            yield pb.Down(chunk=chunk)
        with self.lock:
            self.acct["bytes_out"] += len(u.payload)

    def _can_resume(self, hello: pb.Hello) -> bool:
        if not hello.resume or len(hello.base_versions) != self.plan.P:
            return False
        return all(v in self.proto.history[p] for p, v in enumerate(hello.base_versions))

    def Join(self, hello: pb.Hello, context: grpc.ServicerContext) -> Iterator[pb.Down]:  # noqa: N802
        _check_hello(hello, context)
        now = time.time()
        with self.lock:
            if (
                hello.epoch
                and hello.epoch != self.epoch
                and len(hello.latest_versions) == (self.plan.P)
            ):
                # a learner that saw the previous epoch: nothing it saw may be missing here
                lost = 0
                for p, v in enumerate(hello.latest_versions):
                    if v > self.max_seen[p]:
                        lost += max(0, v - max(self.max_seen[p], self.restored_versions[p]))
                        self.max_seen[p] = v
                if lost:
                    self.acct["lost_committed_rounds"] += lost
                self.events.emit(
                    "seen_check", "syncer", learner=hello.learner, lost_committed_rounds=lost
                )
            heal = not self._can_resume(hello)
            old = self.sessions.pop(hello.learner, None)
            if old is not None:
                old.close()
            sess = _Session(hello.learner, hello.incarnation, now)
            self.sessions[hello.learner] = sess
            outs = self.proto.on_join(now, hello.learner)
            heal_msg = next(o.message for o in outs if isinstance(o, Send))
            self._process(now, [o for o in outs if not isinstance(o, Send)])
            if not heal:
                for p in range(self.plan.P):
                    if self.proto.version[p] > hello.latest_versions[p]:
                        sess.put_update(heal_msg.updates[p], None)
            want = self.opts.expect_learners
            if want and not self.acct.get("start_at") and len(self.sessions) >= want:
                self.acct["start_at"] = now + 0.5
            self.events.emit(
                "join",
                "syncer",
                learner=hello.learner,
                incarnation=hello.incarnation,
                heal=heal,
            )
        context.add_callback(lambda: self._lose(hello.learner, sess, "stream ended"))
        yield pb.Down(welcome=self._welcome(heal))
        if heal:
            for u in heal_msg.updates:
                yield from self._frames(u, heal=True)
        while not sess.closed and not self.stopping.is_set():
            item = sess.get(0.5)
            if item is None:
                continue
            if isinstance(item, tuple):
                yield pb.Down(notice=pb.Notice(kind=item[0], text=item[1]))
            else:
                yield from self._frames(item)

    def _refuse(self, learner: str, fragment: int, reason: str, action: str = "") -> pb.PushReply:
        with self.lock:
            self.acct["refused"] += 1
        self.events.emit("refused", "syncer", learner=learner, fragment=fragment, reason=reason)
        return pb.PushReply(accepted=False, reason=reason, action=action)

    def Push(
        self, request_iterator: Iterator[pb.Up], context: grpc.ServicerContext
    ) -> pb.PushReply:  # noqa: N802
        try:
            first = next(request_iterator)
        except StopIteration:
            return self._refuse("?", -1, "empty push stream")
        if first.WhichOneof("body") != "header":
            return self._refuse("?", -1, "a push must start with a header")
        return self._receive(first.header, request_iterator, context)

    def PushOne(self, req: pb.Single, context: grpc.ServicerContext) -> pb.PushReply:  # noqa: N802
        return self._receive(req.header, iter([pb.Up(chunk=req.payload)]), context)

    def _receive(
        self, h: pb.ContributionHeader, chunks: Iterator[pb.Up], context: grpc.ServicerContext
    ) -> pb.PushReply:
        sess = self.sessions.get(h.learner)
        if sess is None or sess.incarnation != h.incarnation:
            return self._refuse(h.learner, h.fragment, "learner has no live session", "rejoin")
        reason = self._check_header(h)
        if reason:
            return self._refuse(h.learner, h.fragment, reason)
        try:
            asm = Assembler(h.total_bytes, h.crc32, self.max_bytes)
            for msg in chunks:
                if msg.WhichOneof("body") != "chunk":
                    raise TransferError("only chunks may follow the header")
                asm.add(msg.chunk)
            if not asm.complete or not context.is_active():  # the sender vanished mid-way
                raise ConnectionError(f"stream cut after {asm.size} of {asm.total} bytes")
            payload = asm.payload()
        except TransferError as exc:
            return self._refuse(h.learner, h.fragment, str(exc))
        except Exception as exc:  # the stream broke: nothing of it reaches the protocol
            with self.lock:
                self.acct["broken_transfers"] += 1
            self.events.emit(
                "transfer_broken", "syncer", learner=h.learner, fragment=h.fragment, error=str(exc)
            )
            return pb.PushReply(accepted=False, reason=f"transfer broken: {exc}")
        try:
            scheme, numel = codec.peek(payload)
        except codec.CodecError as exc:
            return self._refuse(h.learner, h.fragment, f"bad payload: {exc}")
        if scheme != self.lcfg.codec:
            return self._refuse(
                h.learner, h.fragment, f"codec {scheme}, this run uses {self.lcfg.codec}"
            )
        want = self.plan.fragments[h.fragment].numel
        if numel != want:
            return self._refuse(
                h.learner, h.fragment, f"fragment {h.fragment} has {want} values, got {numel}"
            )
        now = time.time()
        c = Contribution(
            learner=h.learner,
            fragment=h.fragment,
            seq=h.seq,
            base_version=h.base_version,
            payload=payload,
            steps=h.steps,
            tokens=h.tokens,
            sent_at=min(max(h.sent_at, now - 600.0), now),
            step_time=h.step_time,
        )
        with self.lock:
            sess.last_seen = now
            outs = self.proto.on_contribution(now, c)
            refused = [o for o in outs if isinstance(o, Event) and o.kind == "refused"]
            if not refused:
                self.acct["accepted"] += 1
                self.acct["bytes_in"] += len(payload)
                self.acct["useful_s"] += max(h.work_s, 0.0)
            self._process(now, [o for o in outs if o not in refused])
        if refused:
            reason = refused[0].data["reason"]
            return self._refuse(
                h.learner, h.fragment, reason, "heal" if "must heal" in reason else ""
            )
        return pb.PushReply(accepted=True)

    def _check_header(self, h: pb.ContributionHeader) -> str | None:
        if h.protocol != PROTOCOL:
            return f"protocol {h.protocol}, this syncer speaks {PROTOCOL}"
        if not 0 <= h.fragment < self.plan.P:
            return f"fragment {h.fragment} out of range [0, {self.plan.P})"
        if h.total_bytes > self.max_bytes:
            return f"payload of {h.total_bytes} bytes is over the limit of {self.max_bytes}"
        if h.base_version < 0:
            return f"base version {h.base_version} is negative"
        for k in ("sent_at", "step_time", "work_s"):
            v = getattr(h, k)
            if not math.isfinite(v) or v < 0:
                return f"{k}={v} is not a finite number >= 0"
        return None

    def Heartbeat(self, beat: pb.Beat, context: grpc.ServicerContext) -> pb.BeatReply:  # noqa: N802
        now = time.time()
        with self.lock:
            key = f"{beat.learner}/{beat.incarnation}"
            self.acct["tokens"][key] = max(self.acct["tokens"].get(key, 0), beat.tokens)
            if math.isfinite(beat.work_s):
                self.acct["work_s"][key] = max(self.acct["work_s"].get(key, 0.0), beat.work_s)
            sess = self.sessions.get(beat.learner)
            known = sess is not None and sess.incarnation == beat.incarnation
            if known:
                sess.last_seen = now
                self._report_steps(sess, beat, now)
            stop = self.stop_requested
            budget = self.opts.token_budget
            remaining = max(budget - self.total_tokens(), 0)
            live = max(len(self.sessions), 1)
        return pb.BeatReply(
            epoch=self.epoch,
            known=known,
            stop=stop,
            budget=budget > 0,
            remaining=remaining,
            live=live,
        )

    def _report_steps(self, sess: _Session, beat: pb.Beat, now: float) -> None:
        """The steps a heartbeat reports since the previous one -> `on_progress` (under the
        lock): one report per step (at most 32), at their mean step time, as the virtual-time
        driver reports every step. With the pull schedule only once the learner's Pulls
        stream is open: the pull clock must not tick for a learner that cannot hear it."""
        k = beat.step - sess.reported_step
        if k <= 0 or not math.isfinite(beat.work_s):
            return
        if self.lcfg.schedule == "pull":
            ctl = self.controls.get(beat.learner)
            if ctl is None or ctl.closed or ctl.incarnation != beat.incarnation:
                return
        mean = beat.step_time  # the learner's own average: first report of this session
        if sess.reported_step > 0 and beat.work_s > sess.reported_work_s:
            mean = (beat.work_s - sess.reported_work_s) / k
        sess.reported_step, sess.reported_work_s = beat.step, beat.work_s
        if not (math.isfinite(mean) and mean > 0):
            return
        prog = Progress(beat.learner, beat.step, mean, now)
        for _ in range(min(k, 32)):
            self._process(now, self.proto.on_progress(now, prog))

    def Pulls(self, h: pb.ControlHello, context: grpc.ServicerContext) -> Iterator[pb.ControlDown]:  # noqa: N802
        _check_hello(h, context)
        ctl = _Control(h.learner, h.incarnation)
        with self.lock:
            old = self.controls.get(h.learner)
            if old is not None:
                old.close()
            self.controls[h.learner] = ctl
        context.add_callback(ctl.close)
        yield pb.ControlDown()  # registered: the learner now reports its steps (a heartbeat)
        try:
            while not ctl.closed and not self.stopping.is_set():
                pulls = ctl.get(0.5)
                if pulls:
                    yield pb.ControlDown(
                        pulls=[
                            pb.PullRequest(fragment=x.fragment, tick=x.tick, at=x.at) for x in pulls
                        ]
                    )
        finally:
            ctl.close()
            with self.lock:
                if self.controls.get(h.learner) is ctl:
                    del self.controls[h.learner]

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:  # noqa: N802
        with self.lock:
            return pb.StatusReply(
                epoch=self.epoch,
                tokens=self.total_tokens(),
                rounds=self.proto.rounds_closed,
                live=sorted(self.sessions),
                stop=self.stop_requested,
                versions=list(self.proto.version),
                start_at=float(self.acct.get("start_at") or 0.0),
            )

    # -- threads ------------------------------------------------------------------------------
    def _timer_loop(self) -> None:
        with self.lock:
            while not self.stopping.is_set():
                if not self.timers:
                    self._timer_cv.wait(0.5)
                    continue
                at = self.timers[0][0]
                now = time.time()
                if now < at:
                    self._timer_cv.wait(min(at - now, 0.5))
                    continue
                _, _, key = heapq.heappop(self.timers)
                self._process(now, self.proto.on_timer(now, key))

    def _reaper_loop(self) -> None:
        while not self.stopping.wait(0.25):
            now = time.time()
            with self.lock:
                silent = [
                    (lid, s)
                    for lid, s in self.sessions.items()
                    if now - s.last_seen > self.opts.lost_after_s
                ]
            for lid, s in silent:
                self._lose(lid, s, f"silent for more than {self.opts.lost_after_s} s")

    def _snapshot_loop(self) -> None:
        while not self.stopping.wait(self.opts.snapshot_every_s):
            self.snapshot()

    def start(self) -> int:
        from concurrent.futures import ThreadPoolExecutor

        self.server = grpc.server(
            # each learner holds two long-lived streams (Join, Pulls): room for 120 learners
            ThreadPoolExecutor(max_workers=256),
            interceptors=[self.auth],
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.keepalive_time_ms", 10_000),
                ("grpc.keepalive_timeout_ms", 5_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ],
        )
        pbg.add_SyncerServicer_to_server(self, self.server)
        addr = f"{self.opts.host}:{self.opts.port}"
        creds = server_credentials(self.opts.tls_cert, self.opts.tls_key)
        if creds is None:
            self.port = self.server.add_insecure_port(addr)
        else:
            self.port = self.server.add_secure_port(addr, creds)
        if self.port == 0:
            raise OSError(f"could not listen on {addr}")
        self.server.start()
        for fn in (self._timer_loop, self._reaper_loop, self._snapshot_loop):
            t = threading.Thread(target=fn, name=fn.__name__, daemon=True)
            t.start()
            self._threads.append(t)
        self.events.emit(
            "syncer_started",
            "syncer",
            port=self.port,
            epoch=self.epoch,
            restored=self.restored.found,
        )
        return self.port

    def close_pending(self) -> None:
        """Close every open round now (end of run: nothing more will arrive)."""
        with self.lock:
            now = time.time()
            for p in range(self.plan.P):
                if self.proto.pending[p]:
                    key = ("close", p, self.proto.round_id[p])
                    self._process(now, self.proto.on_timer(now, key))

    def stop(self, final_dir: Path | None = None) -> None:
        self.stopping.set()
        with self.lock:
            for s in self.sessions.values():
                s.close()
            for c in self.controls.values():
                c.close()
        if self.server is not None:
            self.server.stop(grace=1.0).wait(3.0)
        self.close_pending()
        self.snapshot()
        if final_dir is not None:
            from safetensors.torch import save_file

            with self.lock:
                params = {k: v.contiguous() for k, v in self.proto.global_params().items()}
            save_file(params, str(final_dir / "final.safetensors"))
        self.tape.close()
        self.events.emit("syncer_stopped", "syncer", rounds=self.proto.rounds_closed)


class _Frozen:
    """A copy of the protocol's durable state, taken under the lock, written without it."""

    def __init__(self, proto: SyncerProtocol, keep: int) -> None:
        from atoll.core.outer import OuterState

        self.plan = proto.plan
        self.cfg = proto.cfg
        self.theta = [t.clone() for t in proto.theta]
        self.public = [t.clone() for t in proto.public]
        self.version = list(proto.version)
        self.history = [OrderedDict(list(h.items())[-keep:]) for h in proto.history]
        self.outer_state = [
            OuterState(
                None if s.buf is None else s.buf.clone(),
                None if s.acc is None else s.acc.clone(),
                s.count,
            )
            for s in proto.outer_state
        ]
        self.grace = proto.grace
        self.rounds_closed = proto.rounds_closed
