"""Contributions up: the send queue, encoding, PushOne / Push, shaping.

The training side hands over `Outgoing` deltas (atoll.live.learner.messages.Submit); they wait
in `SendQueue` (newest per fragment: a newer send of a fragment supersedes a queued one and
takes over its work), and the up thread encodes each (`codec.ContributionEncoder`: quantize,
compress, error feedback, in the order they go out; a heal's new generation drops older ones)
right before sending it: one unary PushOne when it fits a chunk and no shaping is asked for,
else a Push stream (header, chunks) through the optional token bucket.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from atoll.core.codec import CodecError
from atoll.core.events import PushFailed
from atoll.core.learner import supersede
from atoll.core.messages import Contribution, Outgoing
from atoll.live.learner.messages import RefusalReceived
from atoll.wire import atoll_pb2 as pb
from atoll.wire import convert
from atoll.wire.chunks import split

if TYPE_CHECKING:
    from atoll.live.comm.link import Link


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


@dataclass(frozen=True)
class Pending:
    """A queued contribution: as handed over, and once encoded (a retry sends the same frame:
    its error-feedback residual is already spent)."""

    outgoing: Outgoing
    encoded: Contribution | None = None

    @property
    def fragment(self) -> int:
        return self.outgoing.fragment


class SendQueue:
    """Contributions waiting to go, newest per fragment, oldest first; the counts that the
    status reports carry (numbered under the same lock)."""

    def __init__(self) -> None:
        self._out: OrderedDict[int, Pending] = OrderedDict()
        self._cv = threading.Condition()
        self._closed = False
        self.in_flight = 0
        self.received = 0  # contributions handed over by the training side
        self.generation = 0  # newest heal the training side reported
        self._seq = 0

    def put(self, items: list[Outgoing]) -> None:
        with self._cv:
            for o in items:
                self.received += 1
                old = self._out.pop(o.fragment, None)
                if old is not None:  # the newest send of a fragment goes in its place
                    o = supersede(old.outgoing, o)
                self._out[o.fragment] = Pending(o)
            self._cv.notify()

    def requeue(self, item: Pending) -> None:
        """Back to the front, unless a newer send of its fragment is queued."""
        with self._cv:
            if item.fragment not in self._out:
                self._out[item.fragment] = item
                self._out.move_to_end(item.fragment, last=False)
                self._cv.notify()

    def reset(self, generation: int) -> None:
        """A heal: drop what an older generation queued."""
        with self._cv:
            self.generation = max(self.generation, generation)
            old = [p for p, i in self._out.items() if i.outgoing.generation < self.generation]
            for p in old:
                del self._out[p]

    def take(self) -> Pending | None:
        """The oldest queued contribution, waiting for one (None once closed); it counts as in
        flight until `done`."""
        with self._cv:
            while not self._out and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            _, item = self._out.popitem(last=False)
            self.in_flight = 1
            return item

    def done(self) -> None:
        with self._cv:
            self.in_flight = 0

    def counts(self) -> tuple[int, int, int]:
        """(queued including in flight, received, a new report number)."""
        with self._cv:
            self._seq += 1
            return len(self._out) + self.in_flight, self.received, self._seq

    def wake_all(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


class Uplink:
    def __init__(self, link: Link) -> None:
        self.link = link
        self.bucket = TokenBucket(link.o.shape_mbps * 1e6) if link.o.shape_mbps > 0 else None

    def encode(self, item: Pending) -> Pending | None:
        """Quantize + compress (None if a heal made it obsolete, or no Welcome set the codec)."""
        if item.encoded is not None:
            return item
        enc, o = self.link.encoder, item.outgoing
        if enc is None or o.generation < self.link.queue.generation:
            return None
        try:
            c = enc.encode(o)
        except CodecError as exc:  # the learner's own values are broken (a diverged model)
            self.link.sink(RefusalReceived(o.fragment, f"not sent: {exc}", "heal"))
            return None
        return None if c is None else Pending(o, c)

    def run(self) -> None:
        """The up thread."""
        link = self.link
        while not link.closing.is_set():
            item = link.queue.take()
            if item is None:
                return
            try:
                self._push(item)
            finally:
                link.queue.done()
                # each status report costs the training thread a message to handle: one per
                # interval, or after every send while it waits for the queue to drain
                if link.finishing or time.monotonic() >= link.status_at + link.o.status_interval_s:
                    link.status()

    def _push(self, raw: Pending) -> None:
        link = self.link
        if not link.connected.wait(0.5):
            link.queue.requeue(raw)
            return
        item = self.encode(raw)
        if item is None:
            return
        c = item.encoded
        assert c is not None
        link.faults.wait_while_cut(link.closing)
        slow = link.faults.slow_bps()
        bucket = TokenBucket(slow) if slow > 0 else self.bucket
        timeout = 30.0 + len(c.payload) / 1e5
        try:
            if len(c.payload) <= link.chunk_bytes and bucket is None:
                reply = link.bulk_stub.PushOne(
                    pb.Single(header=self._header(c), payload=c.payload),
                    metadata=link.metadata,
                    timeout=timeout,
                )
            else:
                reply = link.bulk_stub.Push(
                    self._frames(c, bucket), metadata=link.metadata, timeout=timeout
                )
        except grpc.RpcError as exc:
            link.events.record(link.id, PushFailed(fragment=c.fragment, error=str(exc.code())))
            link.queue.requeue(item)
            link.closing.wait(0.2)
            return
        if reply.accepted:
            link.bytes_up += len(c.payload)
        elif reply.action == "rejoin":
            link.queue.requeue(item)
            link.closing.wait(0.2)
        else:
            link.sink(RefusalReceived(c.fragment, reply.reason, reply.action))

    def _header(self, c: Contribution) -> pb.ContributionHeader:
        return convert.contribution_header(c, self.link.o.incarnation)

    def _frames(self, c: Contribution, bucket: TokenBucket | None) -> Iterator[pb.Up]:
        yield pb.Up(header=self._header(c))
        for chunk in split(c.payload, self.link.chunk_bytes):
            if bucket is not None:
                bucket.take(len(chunk))
            yield pb.Up(chunk=chunk)
