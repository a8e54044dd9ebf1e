"""Lightweight learner clients for benchmarks/load.py: no model, no training, the real wire.

One worker process runs several clients, each in a few threads, until a deadline, then writes
its counters to a JSON file. Kinds:

  good    Join (welcome, heal, then every update: it keeps the newest version of each fragment
          as its base), Pulls, a heartbeat every 0.5 s with its step report, and one "step"
          every step_s (+-10%); at each step boundary it answers the pulls received since the
          last one with a real-sized codec frame (atoll.core.codec.encode of a small random
          delta of the fragment's numel) by PushOne (or Push when over one chunk).
  slow    as good, but after the heal it reads one message of its Join stream every
          slow_read_s (0: never again): the syncer's outbox for it and its stream fill up.
  vanish  as good, but about every vanish_s it opens a Push stream, sends the header and half
          the chunks, and cancels it. The driver also SIGKILLs its whole process now and then.
  storm   Join on a new connection with a new incarnation, read the welcome and a message or
          two, cancel, close, and again after storm_pause_s, until the deadline.

With a sharded syncer (the address: the shards' addresses, comma-joined, in shard order) every
client holds one connection set per shard: a Join stream (hello.shard/shards set), a Pulls
stream and a heartbeat loop each, and pushes each fragment to the shard that serves it (the
Welcomes' `served`); a storm joins every shard in turn.

Errors of good clients are every RPC error, every refused push, a Join or Pulls stream that
ends, and a heartbeat the syncer answers with known=False (pushes stop at the deadline, calls
are cancelled 1 s later; errors are counted until then).

    python benchmarks/load_clients.py CONFIG      (the secret in ATOLL_SECRET; started by load.py,
                                                 which writes the start time once all are ready)
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import grpc
import torch

from atoll.core import codec
from atoll.core.messages import Contribution
from atoll.wire import atoll_pb2 as pb
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire import convert
from atoll.wire.auth import call_metadata, open_channel
from atoll.wire.chunks import split

TOKENS_PER_STEP = 16 * 64  # batch x context of the built-in model


class Worker:
    """What the clients of one process share: settings, payloads, counters."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.addrs = cfg["address"].split(",")  # a sharded syncer: one address per shard
        self.md = call_metadata(cfg["run_id"], os.environ["ATOLL_SECRET"])
        self.stop = threading.Event()
        self.quiet = threading.Event()  # the deadline: no more pushes (the streams stay open)
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.shard_errors: Counter[str] = Counter()  # "kind.shard" -> errors
        self.samples: dict[str, list[float]] = {"push_ms": [], "beat_ms": [], "answer_ms": []}
        self.pulls: dict[str, tuple[int, float]] = {}  # "shard:tick" -> (fragment, send time)
        self.payloads: dict[int, bytes] = {}
        self.rng = torch.Generator().manual_seed(int(cfg["seed"]))

    def count(self, kind: str, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[f"{kind}.{what}"] += n

    def error(self, kind: str, what: str, shard: int) -> None:
        if self.stop.is_set():
            return  # the end of the run cancels every call: not an error
        with self.lock:
            self.errors[f"{kind}.{what}"] += 1
            self.shard_errors[f"{kind}.{shard}"] += 1

    def hello(self, lid: str, inc: str, shard: int) -> pb.Hello:
        """A fresh learner's Join hello to shard `shard` of the set (0 of 1: unsharded)."""
        h = convert.hello(lid, inc, None)
        h.shard, h.shards = shard, len(self.addrs)
        return h

    def sample(self, name: str, value: float) -> None:
        with self.lock:
            self.samples[name].append((round(time.time(), 3), round(value, 3)))

    def prepare(self, w: pb.Welcome) -> None:
        """One frame per fragment (the run's codec, a random delta of scale 1e-3), made once."""
        with self.lock:
            if self.payloads:
                return
            for f in convert.plan_from_welcome(w).fragments:
                x = torch.randn(f.numel, generator=self.rng) * 1e-3
                self.payloads[f.index] = codec.encode(x, w.settings.codec, w.settings.group or 64)


def code_of(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    return code.name if code is not None else type(exc).__name__


class Link:
    """A client's connections to one shard: its own channels, Join stream (hello.shard and
    hello.shards set), Pulls stream and heartbeat loop."""

    def __init__(self, c: Client, shard: int) -> None:
        w = c.w
        self.c, self.w, self.shard, self.kind = c, w, shard, c.kind
        addr = w.addrs[shard]
        self.bulk = open_channel(addr, f"bulk-{c.id}-{c.inc}-{shard}")
        self.ctl = open_channel(addr, f"ctl-{c.id}-{c.inc}-{shard}")
        self.bstub, self.cstub = pbg.SyncerStub(self.bulk), pbg.SyncerStub(self.ctl)
        self.welcomed = threading.Event()

    def error(self, what: str) -> None:
        self.w.error(self.kind, what, self.shard)

    # -- the Join stream ----------------------------------------------------------------------
    def join_loop(self) -> None:
        w, c = self.w, self.c
        while not w.stop.is_set():
            call = self.bstub.Join(w.hello(c.id, c.inc, self.shard), metadata=w.md)
            c.calls.append(call)
            try:
                self.read_join(call)
                self.error("join_ended")
            except grpc.RpcError as exc:
                self.error(f"join_{code_of(exc)}")
            c.calls.remove(call)
            w.count(self.kind, "rejoins")
            w.stop.wait(0.2)

    def read_join(self, call) -> None:
        healing, slow, c = 0, self.kind == "slow", self.c
        for msg in call:
            which = msg.WhichOneof("body")
            if which == "welcome":
                c.chunk = msg.welcome.chunk_bytes or c.chunk
                self.w.prepare(msg.welcome)
                with c.cv:
                    c.route.update((p, self.shard) for p in msg.welcome.served)
                healing = len(msg.welcome.served) if msg.welcome.heal else 0
                self.w.count(self.kind, "joins")
            elif which == "update":
                c.versions[msg.update.fragment] = msg.update.version
                self.w.count(self.kind, "updates")
                if healing and msg.update.heal:
                    healing -= 1
                    if healing == 0:
                        self.welcomed.set()
            if slow and self.welcomed.is_set():  # from now on it hardly reads
                pause = float(self.w.cfg["slow_read_s"])
                if self.w.stop.wait(pause if pause > 0 else 1e9):
                    return

    # -- control: Pulls, heartbeats -----------------------------------------------------------
    def pulls_loop(self) -> None:
        w, c = self.w, self.c
        while not w.stop.is_set():
            if not self.welcomed.wait(0.2):
                continue
            call = self.cstub.Pulls(convert.control_hello(c.id, c.inc), metadata=w.md)
            c.calls.append(call)
            try:
                for msg in call:
                    now = time.time()
                    for p in msg.pulls:
                        with c.cv:
                            c.due[p.fragment] = (p.tick, p.at, now)
                        if self.kind == "good":  # each shard has its own tick clock
                            with w.lock:
                                w.pulls[f"{self.shard}:{p.tick}"] = (p.fragment, p.at)
                self.error("pulls_ended")
            except grpc.RpcError as exc:
                self.error(f"pulls_{code_of(exc)}")
            c.calls.remove(call)
            w.stop.wait(0.2)

    def beat_loop(self) -> None:
        w, c = self.w, self.c
        while not w.stop.wait(0.5):
            if not self.welcomed.is_set():
                continue
            n = c.steps
            beat = pb.Beat(
                learner=c.id, incarnation=c.inc, step=n, tokens=n * TOKENS_PER_STEP,
                step_time=c.step_s, work_s=n * c.step_s,
            )  # fmt: skip
            t = time.perf_counter()
            try:
                reply = self.cstub.Heartbeat(beat, metadata=w.md, timeout=5.0)
            except grpc.RpcError as exc:
                self.error(f"beat_{code_of(exc)}")
                continue
            if self.kind == "good":
                w.sample("beat_ms", (time.perf_counter() - t) * 1e3)
            if not reply.known:
                self.error("beat_unknown")


class Client:
    """One learner: a Link per shard, and one step loop that answers every shard's pulls,
    each fragment to the shard that serves it (the Welcomes' `served`)."""

    def __init__(self, w: Worker, lid: str, kind: str) -> None:
        self.w, self.id, self.kind = w, lid, kind
        self.inc = uuid.uuid4().hex[:12]
        self.step_s = float(w.cfg["step_s"]) * random.uniform(0.95, 1.05)
        self.versions: dict[int, int] = {}
        self.route: dict[int, int] = {}  # fragment -> shard
        self.cv = threading.Condition()
        self.due: dict[int, tuple[int, float, float]] = {}  # fragment -> (tick, at, received)
        self.steps, self.seq, self.chunk = 0, 0, 256 * 1024
        self.sent_steps: dict[int, int] = {}
        self.calls: list = []
        self.next_vanish = time.time() + random.uniform(0.5, 1.5) * w.cfg["vanish_s"]
        self.links = [Link(self, s) for s in range(len(w.addrs))]

    def threads(self) -> list[threading.Thread]:
        fns = [f for k in self.links for f in (k.join_loop, k.pulls_loop, k.beat_loop)]
        return [
            threading.Thread(target=f, daemon=True, name=f"{self.id}-{f.__name__}")
            for f in [*fns, self.step_loop]
        ]

    def close(self) -> None:
        for c in list(self.calls):
            c.cancel()
        with self.cv:
            self.cv.notify_all()
        for k in self.links:
            k.bulk.close()
            k.ctl.close()

    def welcomed(self) -> bool:
        return all(k.welcomed.is_set() for k in self.links)

    # -- steps and pushes ---------------------------------------------------------------------
    def step_loop(self) -> None:
        w = self.w
        while not w.stop.is_set():
            if not self.welcomed():
                w.stop.wait(0.05)
                continue
            if w.stop.wait(self.step_s * random.uniform(0.9, 1.1)) or w.quiet.is_set():
                return
            self.steps += 1
            with self.cv:
                due, self.due = self.due, {}
            for frag, (_tick, _at, received) in due.items():
                self.push(frag, received)

    def contribution(self, frag: int) -> Contribution:
        k = max(self.steps - self.sent_steps.get(frag, 0), 1)
        self.sent_steps[frag] = self.steps
        self.seq += 1
        return Contribution(
            learner=self.id, fragment=frag, seq=self.seq, base_version=self.versions.get(frag, 0),
            payload=self.w.payloads[frag], steps=k, tokens=k * TOKENS_PER_STEP,
            sent_at=time.time(), step_time=self.step_s, work_s=k * self.step_s,
        )  # fmt: skip

    def push(self, frag: int, received: float) -> None:
        w = self.w
        link = self.links[self.route[frag]]
        c = self.contribution(frag)
        h = convert.contribution_header(c, self.inc)
        if self.kind == "vanish" and time.time() >= self.next_vanish:
            self.next_vanish = time.time() + random.uniform(0.5, 1.5) * w.cfg["vanish_s"]
            return self.vanish(link, h, c.payload)
        t = time.perf_counter()
        try:
            if len(c.payload) <= self.chunk:
                single = pb.Single(header=h, payload=c.payload)
                reply = link.bstub.PushOne(single, metadata=w.md, timeout=30.0)
            else:
                frames = [pb.Up(header=h)] + [pb.Up(chunk=x) for x in split(c.payload, self.chunk)]
                reply = link.bstub.Push(iter(frames), metadata=w.md, timeout=30.0)
        except grpc.RpcError as exc:
            return link.error(f"push_{code_of(exc)}")
        if self.kind == "good":
            w.sample("push_ms", (time.perf_counter() - t) * 1e3)
            w.sample("answer_ms", (time.time() - received) * 1e3)
        if reply.accepted:
            w.count(self.kind, "accepted")
        else:
            link.error(f"refused_{reply.code or 'unknown'}")

    def vanish(self, link: Link, h: pb.ContributionHeader, payload: bytes) -> None:
        """A Push stream cut after the header and half of its chunks."""
        parts = list(split(payload, max(len(payload) // 4, 1)))
        gate = threading.Event()

        def frames():
            yield pb.Up(header=h)
            for i, part in enumerate(parts):
                if i == len(parts) // 2:
                    gate.wait(5.0)
                    return
                yield pb.Up(chunk=part)

        fut = link.bstub.Push.future(frames(), metadata=self.w.md, timeout=30.0)
        time.sleep(0.05)
        fut.cancel()
        gate.set()
        self.w.count(self.kind, "cut_pushes")


def storm(w: Worker, lid: str) -> None:
    """Join every shard, read a little, cancel, on new connections and a new incarnation,
    again and again."""
    while not w.stop.is_set():
        inc = uuid.uuid4().hex[:12]
        for shard, addr in enumerate(w.addrs):
            ch = open_channel(addr, f"storm-{lid}-{inc}-{shard}")
            call = pbg.SyncerStub(ch).Join(w.hello(lid, inc, shard), metadata=w.md)
            reads = random.randint(1, 3)  # the welcome, and maybe a fragment or two of the heal
            try:
                for i, _msg in enumerate(call):
                    if i + 1 >= reads:
                        break
                w.count("storm", "joins")
            except grpc.RpcError as exc:
                w.error("storm", f"join_{code_of(exc)}", shard)
            call.cancel()
            ch.close()
        w.stop.wait(float(w.cfg["storm_pause_s"]))


def main(path: str) -> int:
    cfg = json.loads(Path(path).read_text())
    if cfg.get("cpus"):
        os.sched_setaffinity(0, cfg["cpus"])
    torch.set_num_threads(1)
    Path(cfg["results"] + ".ready").touch()  # imports done: the driver starts the clock
    start = Path(cfg["start_file"])
    while not start.exists():
        time.sleep(0.05)
    times = json.loads(start.read_text())
    cfg["deadline"] = times["deadline"]
    # everyone starts together; the misbehaving clients once the good ones have run a while
    time.sleep(max(times["late_start" if cfg["late"] else "start"] - time.time(), 0.0))
    w = Worker(cfg)
    clients, threads = [], []
    for lid, kind in cfg["clients"]:
        if kind == "storm":
            threads.append(threading.Thread(target=storm, args=(w, lid), daemon=True))
        else:
            c = Client(w, lid, kind)
            clients.append(c)
            threads += c.threads()
    for t in threads:
        t.start()
    w.stop.wait(max(cfg["deadline"] - time.time(), 0.0))
    w.quiet.set()  # pushes in flight finish within the next second, then every call is cancelled
    time.sleep(1.0)
    w.stop.set()
    for c in clients:
        c.close()
    for t in threads:
        t.join(timeout=3.0)
    with w.lock:
        out = {
            "counts": dict(w.counts),
            "errors": dict(w.errors),
            "shard_errors": dict(w.shard_errors),
            "samples": w.samples,
            "pulls": w.pulls,
            "clients": cfg["clients"],
        }
    tmp = Path(cfg["results"] + ".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(cfg["results"])
    sys.stdout.flush()
    os._exit(0)  # grpc's threads of cancelled calls need not be waited for


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
