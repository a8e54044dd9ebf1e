"""The live syncer's gRPC handlers: each turns a call into core inputs (through
atoll.wire.convert) under the runtime's lock, and the core's answer back into a reply.

Streams: Join (welcome, heal or resume, then every broadcast update), Push/PushOne (one
contribution), Heartbeat (liveness, tokens, step reports for the pull clock), Pulls (the
syncer's pulls on the learner's control channel), Status.

A contribution reaches `on_contribution` only after its chunks were fully received and the
size and crc32 checked; a stream cut in the middle is dropped whole. What it contains (numbers,
codec, size, base version) is the core's to check (atoll.core.checks).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc

from atoll.core.events import FINISHED, LimitReached, TransferBroken
from atoll.core.messages import Heal, PushAnswer, Refusal, Rejection, Send
from atoll.live.syncer.outbox import Control, Session
from atoll.live.syncer.runtime import SyncerRuntime
from atoll.wire import PROTOCOL, convert
from atoll.wire import atoll_pb2 as pb
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire.chunks import Assembler, TransferError, split


def _check_hello(h: pb.Hello | pb.ControlHello, context: grpc.ServicerContext) -> None:
    """Refuse a stream opened by another protocol version or without a learner identity."""
    if h.protocol != PROTOCOL:
        context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"learner speaks protocol {h.protocol}, this syncer {PROTOCOL}",
        )
    if not h.learner or not h.incarnation:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "learner and incarnation are required")


class Handlers(pbg.SyncerServicer):
    def __init__(self, rt: SyncerRuntime, welcome: pb.Welcome) -> None:
        self.rt = rt
        self._welcome = welcome  # the run's welcome, without epoch and heal flag
        self.max_bytes = welcome.max_fragment_bytes
        self._heal_prep = threading.Lock()  # one heal encoded at a time (the rest reuse it)

    # -- Join ---------------------------------------------------------------------------------
    def _frames(self, u, learner: str, reading: Session | None = None) -> Iterator[pb.Down]:
        """An update's messages. `reading`: the session of a learner reading its heal, which
        sends no heartbeat before it has a model to train (a heal of 100M parameters takes
        seconds on a slow link): each message it takes shows it is there."""
        chunk = self._welcome.chunk_bytes
        inline = len(u.payload) <= chunk  # one message instead of two
        with self.rt.cpu.timed("send"):
            msg = pb.Down(update=convert.update_header(u, reading is not None, inline))
        yield msg
        for part in [] if inline else split(u.payload, chunk):
            if reading is not None:
                reading.last_seen = time.time()  # (gRPC takes the next one as it is read)
            with self.rt.cpu.timed("send"):
                msg = pb.Down(chunk=part)
            yield msg
        if reading is not None:
            reading.last_seen = time.time()
        with self.rt.lock:
            self.rt.acct["bytes_out"] += len(u.payload)
            self.rt.roster.sent(learner, u.fragment, u.version, len(u.payload))

    def _check_shard(self, hello: pb.Hello, context: grpc.ServicerContext) -> None:
        """A learner must take this syncer for the shard it is (core/shards.py)."""
        w = self._welcome
        want = (hello.shard, max(hello.shards, 1))
        if want != (w.shard, w.shards):
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this syncer is shard {w.shard}/{w.shards} of run {self.rt.opts.run_id!r}, the "
                f"learner took it for shard {want[0]}/{want[1]}: give every learner all the "
                "shards' addresses, in shard order (--syncer ADDR0,ADDR1,...)",
            )

    def Join(self, hello: pb.Hello, context: grpc.ServicerContext) -> Iterator[pb.Down]:  # noqa: N802
        _check_hello(hello, context)
        self._check_shard(hello, context)
        rt = self.rt
        resume = convert.resume_from_hello(hello, rt.epoch, rt.epochs())
        digests = convert.digests_from_hello(hello) if resume is None else None
        healing = resume is None or not resume.keep_progress  # (one that cannot resume too)
        if healing and len(rt.sessions) < rt.opts.max_learners:
            # the heal's encoding, outside the lock; joins at once wait for the first one's
            with self._heal_prep, rt.cpu.timed("heal"):
                rt.proto.prepare_heal(digests)
        with rt.lock:
            now = time.time()
            if hello.learner not in rt.sessions and len(rt.sessions) >= rt.opts.max_learners:
                self._over_limit(context, "learners", rt.opts.max_learners, hello.learner)
            listening = rt.can_hear(hello.learner, hello.incarnation)
            outs = rt.proto.on_join(
                now, hello.learner, resume, hello.incarnation, listening, digests
            )
            old = rt.sessions.pop(hello.learner, None)
            if old is not None:
                old.close()
            # its silence counts from its admission, not from its call: it may have waited
            sess = Session(hello.learner, hello.incarnation, time.time())
            rt.sessions[hello.learner] = sess
            rt.books.joined(hello.learner, hello.incarnation)
            rt.roster.joined(hello.learner, hello.incarnation, hello.ranks, rt.sessions)
            msg = next(o.message for o in outs if isinstance(o, Send))
            heal = isinstance(msg, Heal)
            rt.process(now, [o for o in outs if not isinstance(o, Send)])
            if not heal:  # resumed: what moved on since it last heard, in full
                for u in msg.updates:
                    sess.put_update(u, rt.proto.coalesce)
            rt.joined(now)
        # the stream's end: a finish when the session's final beat came first, else a loss
        why = lambda: FINISHED if sess.finishing else "stream ended"  # noqa: E731
        context.add_callback(lambda: rt.lose(hello.learner, sess, why()))
        w = pb.Welcome()
        w.CopyFrom(self._welcome)
        w.epoch, w.heal = rt.epoch, heal
        yield pb.Down(welcome=w)
        if heal:
            for u in msg.updates:
                yield from self._frames(u, hello.learner, reading=sess)
        while not sess.closed and not rt.stopping.is_set():
            item = sess.get(0.5)
            if item is not None:
                yield from self._frames(item, hello.learner)

    def _over_limit(
        self, context: grpc.ServicerContext, what: str, limit: int, learner: str
    ) -> None:
        self.rt.record(LimitReached(what=what, limit=limit, learner=learner[:100]))
        context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED, f"this syncer takes at most {limit} {what}"
        )

    # -- Push ---------------------------------------------------------------------------------
    def _refuse(self, learner: str, fragment: int, code: Refusal, reason: str) -> pb.PushReply:
        rejection = Rejection(code, reason)
        self.rt.record(rejection.refused(learner, fragment))
        return convert.push_reply(rejection.answer())

    def Push(  # noqa: N802
        self, request_iterator: Iterator[pb.Up], context: grpc.ServicerContext
    ) -> pb.PushReply:
        try:
            first = next(request_iterator)
        except StopIteration:
            return self._refuse("?", -1, Refusal.TRANSFER, "empty push stream")
        if first.WhichOneof("body") != "header":
            return self._refuse("?", -1, Refusal.TRANSFER, "a push must start with a header")
        return self._receive(first.header, request_iterator, context)

    def PushOne(self, req: pb.Single, context: grpc.ServicerContext) -> pb.PushReply:  # noqa: N802
        return self._receive(req.header, iter([pb.Up(chunk=req.payload)]), context)

    def _receive(
        self, h: pb.ContributionHeader, chunks: Iterator[pb.Up], context: grpc.ServicerContext
    ) -> pb.PushReply:
        rt = self.rt
        sess = rt.sessions.get(h.learner)
        if sess is None or sess.incarnation != h.incarnation:
            reason = (
                f"learner {h.learner!r} (incarnation {h.incarnation!r}) has no live session "
                "here: it must join (open a Join stream) before it contributes"
            )
            return self._refuse(h.learner, h.fragment, Refusal.NOT_JOINED, reason)
        if h.protocol != PROTOCOL:
            reason = f"protocol {h.protocol}, this syncer speaks {PROTOCOL}"
            return self._refuse(h.learner, h.fragment, Refusal.HEADER, reason)
        if h.total_bytes > self.max_bytes:
            reason = f"payload of {h.total_bytes} bytes is over the limit of {self.max_bytes}"
            return self._refuse(h.learner, h.fragment, Refusal.TOO_LARGE, reason)
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
            return self._refuse(h.learner, h.fragment, Refusal.TRANSFER, str(exc))
        except Exception as exc:  # the stream broke: nothing of it reaches the protocol
            rt.record(TransferBroken(learner=h.learner, fragment=h.fragment, error=str(exc)))
            reason = f"transfer broken: {exc}"
            return convert.push_reply(Rejection(Refusal.TRANSFER, reason).answer())
        now = time.time()
        # crc, decompression and the frame's measure on this thread, outside the lock
        with rt.cpu.timed("prepare"):
            c = rt.proto.prepare(convert.contribution_from_header(h, payload, now))
        with rt.lock:
            sess.last_seen = now
            t0 = time.thread_time()
            outs = rt.proto.on_contribution(now, c)
            rt.cpu.protocol_call(t0, outs)
            rt.process(now, outs)
        return convert.push_reply(next(o for o in outs if isinstance(o, PushAnswer)))

    # -- control ------------------------------------------------------------------------------
    def Heartbeat(self, beat: pb.Beat, context: grpc.ServicerContext) -> pb.BeatReply:  # noqa: N802
        rt = self.rt
        now = time.time()
        counters = (beat.step, beat.tokens, beat.work_s)
        progress = convert.progress_from_beat(beat, now)
        with rt.lock:
            known, answer = rt.beat(now, beat.learner, beat.incarnation, beat.final, counters,
                                    progress)  # fmt: skip
        return convert.beat_reply(rt.epoch, known, answer)

    def Pulls(self, h: pb.ControlHello, context: grpc.ServicerContext) -> Iterator[pb.ControlDown]:  # noqa: N802
        _check_hello(h, context)
        rt = self.rt
        ctl = Control(h.learner, h.incarnation)
        with rt.lock:
            if h.learner not in rt.controls and len(rt.controls) >= rt.opts.max_learners:
                self._over_limit(context, "Pulls streams", rt.opts.max_learners, h.learner)
            rt.listening(ctl, True)
        context.add_callback(ctl.close)
        yield pb.ControlDown()  # registered: the learner now reports its steps (a heartbeat)
        try:
            while not ctl.closed and not rt.stopping.is_set():
                pulls = ctl.get(0.5)
                if pulls:
                    yield convert.pulls_message(pulls)
        finally:
            ctl.close()
            with rt.lock:
                rt.listening(ctl, False)

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:  # noqa: N802
        rt = self.rt
        with rt.lock:
            return pb.StatusReply(
                epoch=rt.epoch,
                tokens=rt.total_tokens(),
                rounds=rt.proto.rounds_closed,
                live=sorted(rt.sessions),
                stop=rt.stop_requested,
                versions=list(rt.proto.version),
                start_at=float(rt.acct.get("start_at") or 0.0),
            )
