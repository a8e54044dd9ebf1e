"""`ShardedComm`: a learner's communication with a sharded syncer (atoll.core.shards): one
`Comm` per shard, each its own connection, threads, send queue and session, behind the
interface of one `Comm`.

It routes and combines, and decides nothing of the protocol:
- down (training -> shards): a step's contributions each to the shard that serves their
  fragment (the shards' Welcomes say which), counters to every shard (each times its pull
  clock from them), a Reset or a heal request to the shards of the fragments it names;
- up (shards -> training): Welcomes, heals, updates, pulls and refusals as they come (the
  training side keys each Welcome's epoch by its shard); the counters combined: connected when
  every shard is, bytes and queues summed, the run's stop and token budget as the home shard
  (0) says; a final heartbeat is done when every shard has answered it.
While a shard is down its fragments' contributions wait in its queue and their pulls stop; the
other shards go on; the learner keeps training (its waits are bounded by `wait_s`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from atoll.live.comm.messages import (
    BeatDone,
    BeatOnce,
    CommOptions,
    CommStatus,
    FromComm,
    RequestHeal,
    Reset,
    StepState,
    ToComm,
    Welcomed,
)
from atoll.live.comm.side import Comm
from atoll.wire import atoll_pb2 as pb


def open_comm(opts: CommOptions, sink: Callable[[FromComm], None]) -> Comm | ShardedComm:
    """One `Comm` for a syncer's address; a `ShardedComm` for several (a sharded syncer)."""
    if "," in opts.address:
        return ShardedComm(opts, sink)
    return Comm(opts, sink)


class ShardedComm:
    def __init__(self, opts: CommOptions, sink: Callable[[FromComm], None]) -> None:
        addresses = [a.strip() for a in opts.address.split(",")]
        self.sink = sink
        self.S = S = len(addresses)
        self.shard_of: dict[int, int] = {}  # fragment -> shard, from the Welcomes
        self._lock = threading.Lock()
        self._status = [CommStatus() for _ in range(S)]
        self._seq = 0
        self._beats: dict[int, bool] = {}  # shard -> counted, for the BeatOnce under way
        self.comms = [
            Comm(dataclasses.replace(opts, address=a, shard=i, shards=S), self._sink_of(i))
            for i, a in enumerate(addresses)
        ]
        self.id = opts.learner_id
        for comm in self.comms[1:]:  # one upload limit for the learner's link, not one each
            comm.up.bucket = self.comms[0].up.bucket

    # -- up -----------------------------------------------------------------------------------
    def _sink_of(self, shard: int) -> Callable[[FromComm], None]:
        def sink(item: FromComm) -> None:
            match item:
                case Welcomed(data):
                    w = pb.Welcome.FromString(data)
                    with self._lock:
                        self.shard_of.update((p, shard) for p in w.served)
                    self.sink(item)
                case CommStatus():
                    self._combine(shard, item)
                case BeatDone(counted):
                    with self._lock:
                        self._beats[shard] = counted
                        done = len(self._beats) == self.S
                        home = self._beats.get(0, counted)
                    if done:
                        self.sink(BeatDone(home))
                case _:
                    self.sink(item)

        return sink

    def _combine(self, shard: int, st: CommStatus) -> None:
        with self._lock:
            if st.seq < self._status[shard].seq:
                return  # an older snapshot that overtook a newer one
            self._status[shard] = st
            all_ = self._status
            home = all_[0]
            wires = [s.wire for s in all_]
            self._seq += 1
            combined = CommStatus(
                seq=self._seq,
                connected=all(s.connected for s in all_),
                bytes_up=sum(s.bytes_up for s in all_),
                reconnects=sum(s.reconnects for s in all_),
                queued=sum(s.queued for s in all_),
                received=sum(s.received for s in all_),
                stop=home.stop,
                budget=home.budget,
                wire=None
                if any(w is None for w in wires)
                else (sum(w[0] for w in wires), sum(w[1] for w in wires)),  # type: ignore[index]
            )
            self.sink(combined)  # under the lock: the training side sees them in order

    # -- down ---------------------------------------------------------------------------------
    def _shards(self, fragments: tuple[int, ...] | list[int]) -> set[int]:
        """The shards serving `fragments` (every shard for none, or one not yet known)."""
        with self._lock:
            got = {self.shard_of.get(p, -1) for p in fragments}
        return set(range(self.S)) if not got or -1 in got else got

    def command(self, msg: ToComm) -> bool:
        match msg:
            case StepState(submits=submits) if submits:
                for s, comm in enumerate(self.comms):
                    mine = tuple(x for x in submits if self._shards([x.outgoing.fragment]) == {s})
                    comm.command(dataclasses.replace(msg, submits=mine))
            case Reset(_, fragments):
                for s in self._shards(fragments):
                    self.comms[s].command(msg)
            case RequestHeal(fragment):
                for s in self._shards([] if fragment < 0 else [fragment]):
                    self.comms[s].command(msg)
            case BeatOnce():
                with self._lock:
                    self._beats = {}
                for comm in self.comms:
                    comm.command(msg)
            case _:
                results = [comm.command(msg) for comm in self.comms]
                return all(results)
        return True

    def start(self) -> None:
        for comm in self.comms:
            comm.start()

    def fragment_sizes(self) -> list[int]:
        """Values per fragment, in plan order (every shard's Welcome has the whole plan)."""
        return next((c.fragment_sizes() for c in self.comms if c.session.numel), [])

    def close(self) -> None:
        for comm in self.comms:
            comm.close()
