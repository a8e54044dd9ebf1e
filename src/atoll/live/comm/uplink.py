"""Contributions up: encoding, PushOne / Push, shaping.

The training side hands over `Outgoing` deltas (atoll.live.comm.messages.Submit); they wait
in the `SendQueue` (sendqueue.py: newest per fragment, a newer send of a fragment supersedes a
queued one and takes over its work), and the up thread encodes each
(`codec.ContributionEncoder`: quantize, compress, error feedback, in the order they go out; a
heal's new generation drops older ones) right before sending it: one unary PushOne when it
fits a chunk and no shaping is asked for, else a Push stream (header, chunks) through the
optional token bucket.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc

from atoll.core.codec import CodecError
from atoll.core.events import PushFailed
from atoll.core.messages import Contribution
from atoll.eventlog import EventLog
from atoll.live.comm.messages import NotSent, RefusalReceived
from atoll.live.comm.part import Part
from atoll.live.comm.sendqueue import Pending, SendQueue
from atoll.wire import atoll_pb2 as pb
from atoll.wire import convert
from atoll.wire.chunks import split


class TokenBucket:
    """Limits a sender to `rate_bps` bits per second with a burst of `burst` bytes; senders
    in several threads may share one (a sharded syncer's connections share the link)."""

    def __init__(self, rate_bps: float, burst: int = 64 * 1024) -> None:
        self.rate = rate_bps / 8.0  # bytes per second
        self.burst = float(burst)
        self.tokens = float(burst)
        self.t = time.monotonic()
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> float:
        """Wait until `nbytes` may go; returns the seconds waited."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
            self.t = now
            self.tokens -= nbytes
            if self.tokens >= 0:
                return 0.0
            wait = -self.tokens / self.rate
        time.sleep(wait)
        return wait


@dataclass(eq=False)
class Uplink(Part):
    """The up thread: takes contributions from the queue, encodes and sends them."""

    queue: SendQueue
    events: EventLog
    bucket: TokenBucket | None = field(init=False)  # shaping asked for (`shape_mbps`)

    def __post_init__(self) -> None:
        mbps = self.o.shape_mbps
        self.bucket = TokenBucket(mbps * 1e6) if mbps > 0 else None

    def encode(self, item: Pending) -> Pending | None:
        """Quantize + compress (None if a heal made it obsolete, or no Welcome set the codec)."""
        if item.encoded is not None:
            return item
        enc, o = self.session.encoder, item.outgoing
        if enc is None or o.generation < self.queue.generation:
            return None
        try:
            c = enc.encode(o)
        except CodecError as exc:  # its own values are broken (a diverged model): its protocol
            self.reporter.send(NotSent(o.fragment, str(exc)))  # decides (a heal)
            return None
        return None if c is None else Pending(o, c)

    def run(self) -> None:
        """The up thread."""
        while not self.flags.closing.is_set():
            item = self.queue.take()
            if item is None:
                return
            try:
                self._push(item)
            finally:
                self.queue.done()
                self.reporter.after_send()

    def _push(self, raw: Pending) -> None:
        closing, ch = self.flags.closing, self.channels
        if not self.flags.connected.wait(0.5):
            self.queue.requeue(raw)
            return
        item = self.encode(raw)
        if item is None:
            return
        c = item.encoded
        assert c is not None
        self.faults.wait_while_cut(closing)
        slow = self.faults.slow_bps()
        bucket = TokenBucket(slow) if slow > 0 else self.bucket
        timeout = 30.0 + len(c.payload) / 1e5
        try:
            if len(c.payload) <= self.session.chunk_bytes and bucket is None:
                reply = ch.bulk_stub.PushOne(
                    pb.Single(header=self._header(c), payload=c.payload),
                    metadata=ch.metadata,
                    timeout=timeout,
                )
            else:
                reply = ch.bulk_stub.Push(
                    self._frames(c, bucket), metadata=ch.metadata, timeout=timeout
                )
        except grpc.RpcError as exc:
            failed = PushFailed(fragment=c.fragment, error=str(exc.code()))
            self.events.record(self.o.learner_id, failed)
            self.queue.requeue(item)
            closing.wait(0.2)
            return
        if reply.accepted:
            self.reporter.bytes_up += len(c.payload)
        elif reply.action == "rejoin":
            self.queue.requeue(item)
            closing.wait(0.2)
        else:
            self.reporter.send(RefusalReceived(c.fragment, reply.reason, reply.action))

    def _header(self, c: Contribution) -> pb.ContributionHeader:
        return convert.contribution_header(c, self.o.incarnation)

    def _frames(self, c: Contribution, bucket: TokenBucket | None) -> Iterator[pb.Up]:
        yield pb.Up(header=self._header(c))
        for chunk in split(c.payload, self.session.chunk_bytes):
            if bucket is not None:
                bucket.take(len(chunk))
            yield pb.Up(chunk=chunk)
