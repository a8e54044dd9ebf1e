"""Down: the Join stream on the bulk channel (welcome, heal, broadcast updates).

Payloads up to one chunk ride inline in their update header, larger ones follow as chunks;
each is reassembled and crc-checked (atoll.wire.chunks), and a broadcast update is decoded
here, so that the training thread gets a float32 tensor (`UpdateReceived`). A heal is handed
over whole (`HealReceived`) once every fragment's full value has arrived. The stream
reconnects with backoff (0.2 s doubling to 2 s, with jitter); the Hello asks to *resume*
(local progress kept) unless a heal was requested. Until the first Welcome, each Join that
finds no syncer is told to the training side (`JoinRetry`: what it met, e.g. connection
refused), which says so and gives up after its join timeout; a refusal of the secret ends the
side at once (`CommFailed`, kind "auth").
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import torch

from atoll.core import codec
from atoll.core.events import Disconnected, Reconnected, RefusedBySyncer, TransferFailed
from atoll.core.messages import FragmentUpdate, Heal, UpdateKind
from atoll.eventlog import EventLog
from atoll.live.comm.messages import (
    CommFailed,
    FromComm,
    HealReceived,
    JoinRetry,
    UpdateReceived,
    Welcomed,
)
from atoll.live.comm.part import Part
from atoll.live.comm.session import StepReports
from atoll.wire import atoll_pb2 as pb
from atoll.wire import convert
from atoll.wire.chunks import Assembler, TransferError

UNUSABLE_WELCOMES = 5  # unusable Welcomes in a row before the learner stops (it raises)
REFUSALS = {
    grpc.StatusCode.UNAUTHENTICATED: "auth",  # the secret, run id or protocol (wire/auth.py)
    grpc.StatusCode.FAILED_PRECONDITION: "refused",  # e.g. taken for another shard
}


def unreachable(exc: grpc.RpcError) -> str:
    """What a Join that found no syncer met, in a few words, from its gRPC status."""
    code = exc.code() if hasattr(exc, "code") else None
    details = str(exc.details() if hasattr(exc, "details") else exc) or ""
    low = details.lower()
    if "connection refused" in low:
        return "connection refused"
    if "resolv" in low or "dns" in low or "name not found" in low:
        return "host name not found"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return "no atoll syncer (another service answers)"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED or "timed out" in low or "timeout" in low:
        return "no answer (timed out)"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return f"the syncer is full ({details[:200]})"
    return (details.splitlines() or [str(code)])[0][:200]


@dataclass(eq=False)
class Downlink(Part):
    """The down thread: the Join stream, reopened with backoff until closing."""

    steps: StepReports
    events: EventLog
    _welcomed: bool = field(default=False, init=False)

    def hello(self) -> pb.Hello:
        force = self.channels.take_heal_request()  # a refusal or a broken delta asked for one
        st = self.steps.state  # None: nothing trained yet, its parameters as they started
        past = None if st is None else st.rejoin
        past = past.healing() if past is not None and force else past
        if past is None:
            h = convert.hello(self.id, self.o.incarnation, None, digests=dict(self.o.digests))
        else:
            h = convert.hello(self.id, self.o.incarnation, past, self.session.epoch)
        h.shard, h.shards = self.o.shard, self.o.shards  # the shard it takes its syncer for
        h.ranks = self.o.ranks
        return h

    def run(self) -> None:
        """The down thread."""
        ch, flags, events, say = self.channels, self.flags, self.events, self.reporter.send
        backoff, unusable, attempts = 0.2, 0, 0
        while not flags.closing.is_set():
            attempts += 1
            call = ch.bulk_stub.Join(self.hello(), metadata=ch.metadata)
            ch.set_join(call)
            try:
                for msg in self.reassemble(call):
                    self.faults.wait_while_cut(flags.closing)
                    backoff = 0.2
                    if isinstance(msg, UpdateReceived):  # the training thread gets a tensor
                        if (p := msg.update.fragment) not in self.session.numel:  # not ours
                            why = f"an update of fragment {p}, which the session lacks: dropped"
                            events.record(self.id, TransferFailed(error=why))
                            continue
                        msg = UpdateReceived(msg.update, self.decode(msg.update))
                    say(msg)
            except grpc.RpcError as exc:
                kind = REFUSALS.get(exc.code() if hasattr(exc, "code") else None)
                if kind is not None:
                    say(CommFailed(f"syncer refused us: {exc.details()}", kind))
                    events.record(self.id, RefusedBySyncer(reason=str(exc.details())))
                    flags.closing.set()
                    break
                if not self._welcomed and not flags.connected.is_set():  # never joined yet
                    say(JoinRetry(self.o.address, attempts, unreachable(exc)))
            except TransferError as exc:
                events.record(self.id, TransferFailed(error=str(exc)))
                # before any Welcome of this call was usable: the syncer speaks a session this
                # learner cannot use, which retrying does not change; stop loudly
                unusable += 0 if flags.connected.is_set() else 1
                if unusable >= UNUSABLE_WELCOMES:
                    say(CommFailed(f"the syncer's Welcome cannot be used: {exc}", "unusable"))
                    flags.closing.set()
                    break
            finally:
                if flags.connected.is_set():  # this call's Welcome was usable
                    unusable = 0
                flags.connected.clear()
                ch.set_join(None)
            if flags.closing.is_set():
                break
            self.reporter()
            events.record(self.id, Disconnected(retry_in_s=round(backoff, 2)))
            flags.closing.wait(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, 2.0)

    def decode(self, u: FragmentUpdate) -> torch.Tensor | None:
        """An update's payload as a flat float32 tensor; None when it does not decode (the
        training thread then decodes it again and handles the error as before)."""
        try:
            return codec.decode(u.payload, self.session.numel[u.fragment])
        except ValueError:
            return None

    def _on_welcome(self, w: pb.Welcome) -> Welcomed:
        """A (re)join: the session's settings, and the Welcome for the training side."""
        self.session.welcome(w)
        self.flags.connected.set()
        if self._welcomed:
            self.reporter.reconnects += 1
            self.events.record(self.id, Reconnected(heal=w.heal, epoch=w.epoch))
        self._welcomed = True
        self.session.joins += 1
        self.steps.rejoined()
        self.reporter()
        return Welcomed(w.SerializeToString())

    def reassemble(self, call: Any) -> Iterator[FromComm]:
        """Down messages -> `Welcomed`, `UpdateReceived` (not yet decoded), `HealReceived`."""
        header: Any = None
        asm: Assembler | None = None
        heal_parts: list[FragmentUpdate] = []
        expect_heal = 0
        for msg in call:
            which = msg.WhichOneof("body")
            if which == "welcome":
                w = msg.welcome  # a shard's heal carries the fragments it serves
                expect_heal = (len(w.served) or len(w.fragments)) if w.heal else 0
                heal_parts = []
                yield self._on_welcome(msg.welcome)
            elif which == "update":
                header = msg.update
                asm = Assembler(header.total_bytes, header.crc32, self.session.max_bytes)
                if header.payload:  # inline: the whole payload, no chunks follow
                    asm.add(header.payload)
                if asm.complete:
                    u = convert.update_from_header(header, asm.payload())
                    yield from _completed(u, header.heal, heal_parts, expect_heal)
            elif which == "chunk":
                if asm is None:
                    raise TransferError("chunk without a header")
                asm.add(msg.chunk)
                if asm.complete:
                    u = convert.update_from_header(header, asm.payload())
                    asm = None
                    yield from _completed(u, header.heal, heal_parts, expect_heal)


def _completed(
    u: FragmentUpdate, heal: bool, parts: list[FragmentUpdate], expect: int
) -> Iterator[FromComm]:
    if u.kind is UpdateKind.HELD and not heal:
        raise convert.MessageError("UpdateHeader.kind", u.kind, "'held' only in a heal")
    if heal:
        parts.append(u)
        if len(parts) == expect:
            yield HealReceived(Heal(tuple(parts)))
            parts.clear()
    else:
        yield UpdateReceived(u)
