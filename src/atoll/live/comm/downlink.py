"""Down: the Join stream on the bulk channel (welcome, heal, broadcast updates).

Payloads up to one chunk ride inline in their update header, larger ones follow as chunks;
each is reassembled and crc-checked (atoll.wire.chunks), and a broadcast update is decoded
here, so that the training thread gets a float32 tensor (`UpdateReceived`). A heal is handed
over whole (`HealReceived`) once every fragment's full value has arrived. The stream
reconnects with backoff (0.2 s doubling to 2 s, with jitter); the Hello asks to *resume*
(local progress kept) unless a heal was requested.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc
import torch

from atoll.core import codec
from atoll.core.events import Disconnected, Reconnected, RefusedBySyncer, TransferFailed
from atoll.core.messages import FragmentUpdate, Heal, Resume
from atoll.live.learner.messages import (
    CommFailed,
    FromComm,
    HealReceived,
    UpdateReceived,
    Welcomed,
)
from atoll.wire import atoll_pb2 as pb
from atoll.wire import convert
from atoll.wire.chunks import Assembler, TransferError

if TYPE_CHECKING:
    from atoll.live.comm.link import Link


UNUSABLE_WELCOMES = 5  # unusable Welcomes in a row before the learner stops (it raises)


class Downlink:
    def __init__(self, link: Link) -> None:
        self.link = link
        self._welcomed = False

    def hello(self) -> pb.Hello:
        link = self.link
        with link.lock:
            force, link.force_heal = link.force_heal, False
        st = link.state
        if st is None:  # nothing trained yet: a fresh learner, its parameters as they started
            return convert.hello(link.id, link.o.incarnation, None, digests=dict(link.o.digests))
        past = Resume(tuple(st.base_versions), tuple(st.latest_versions), keep_progress=not force)
        return convert.hello(link.id, link.o.incarnation, past, link.epoch)

    def run(self) -> None:
        """The down thread."""
        link = self.link
        backoff, unusable = 0.2, 0
        while not link.closing.is_set():
            call = link.bulk_stub.Join(self.hello(), metadata=link.metadata)
            with link.lock:
                link.join_call = call
            try:
                for msg in self.reassemble(call):
                    link.faults.wait_while_cut(link.closing)
                    backoff = 0.2
                    if isinstance(msg, UpdateReceived):  # the training thread gets a tensor
                        if (p := msg.update.fragment) not in link.numel:  # not this session's
                            why = f"an update of fragment {p}, which the session lacks: dropped"
                            link.events.record(link.id, TransferFailed(error=why))
                            continue
                        msg = UpdateReceived(msg.update, self.decode(msg.update))
                    link.sink(msg)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION):
                    link.sink(CommFailed(f"syncer refused us: {exc.details()}"))
                    link.events.record(link.id, RefusedBySyncer(reason=str(exc.details())))
                    link.closing.set()
                    break
            except TransferError as exc:
                link.events.record(link.id, TransferFailed(error=str(exc)))
                # before any Welcome of this call was usable: the syncer speaks a session this
                # learner cannot use, which retrying does not change; stop loudly
                unusable += 0 if link.connected.is_set() else 1
                if unusable >= UNUSABLE_WELCOMES:
                    link.sink(CommFailed(f"the syncer's Welcome cannot be used: {exc}"))
                    link.closing.set()
                    break
            finally:
                if link.connected.is_set():  # this call's Welcome was usable
                    unusable = 0
                link.connected.clear()
                with link.lock:
                    link.join_call = None
            if link.closing.is_set():
                break
            link.status()
            link.events.record(link.id, Disconnected(retry_in_s=round(backoff, 2)))
            link.closing.wait(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, 2.0)

    def decode(self, u: FragmentUpdate) -> torch.Tensor | None:
        """An update's payload as a flat float32 tensor; None when it does not decode (the
        training thread then decodes it again and handles the error as before)."""
        try:
            return codec.decode(u.payload, self.link.numel[u.fragment])
        except ValueError:
            return None

    def _on_welcome(self, w: pb.Welcome) -> Welcomed:
        """A (re)join: the session's settings, and the Welcome for the training side."""
        link = self.link
        link.epoch = w.epoch
        link.chunk_bytes = w.chunk_bytes or link.chunk_bytes
        link.max_bytes = w.max_fragment_bytes or link.max_bytes
        cfg = convert.learner_config_from_welcome(w)
        link.schedule = cfg.schedule
        link.numel = {f.index: f.numel for f in convert.plan_from_welcome(w).fragments}
        if link.encoder is None:
            link.encoder = codec.ContributionEncoder(cfg.codec, cfg.group, cfg.error_feedback)
        link.connected.set()
        if self._welcomed:
            link.reconnects += 1
            link.events.record(link.id, Reconnected(heal=w.heal, epoch=w.epoch))
        self._welcomed = True
        link.joins += 1
        st = link.state
        link.beat_steps = st.steps if st is not None else 0
        link.status()
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
                expect_heal = len(msg.welcome.fragments) if msg.welcome.heal else 0
                heal_parts = []
                yield self._on_welcome(msg.welcome)
            elif which == "update":
                header = msg.update
                asm = Assembler(header.total_bytes, header.crc32, self.link.max_bytes)
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
            elif which == "notice":
                if msg.notice.kind == "stop":
                    self.link.status(stop=True)


def _completed(
    u: FragmentUpdate, heal: bool, parts: list[FragmentUpdate], expect: int
) -> Iterator[FromComm]:
    if u.kind == "held" and not heal:
        raise convert.MessageError("UpdateHeader.kind", u.kind, "'held' only in a heal")
    if heal:
        parts.append(u)
        if len(parts) == expect:
            yield HealReceived(Heal(tuple(parts)))
            parts.clear()
    else:
        yield UpdateReceived(u)
