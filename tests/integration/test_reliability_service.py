"""Regression tests for the reliability defects of issue 9 (the defect numbers are in the
section comments), against the live syncer service in this process over gRPC on loopback:
failing disks and threads, refused calls, sessions that never were. Each fails on the code
before its fix."""

from __future__ import annotations

import errno
import json
import threading
import time

import grpc
import pytest
import torch

from atoll.core import codec
from atoll.core.messages import PullTick, SetTimer
from atoll.eventlog import read_events
from atoll.live.syncer import runtime as runtime_mod
from atoll.wire import PROTOCOL
from atoll.wire import atoll_pb2 as pb
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire.auth import call_metadata, open_channel
from tests.helpers import CFG, RUN, SECRET

MD = call_metadata(RUN, SECRET)


# -- the live syncer in process (the `live` fixture, tests/conftest.py) --------------------------
def _wait(cond, what, timeout=15.0):
    until = time.time() + timeout
    while not cond():
        assert time.time() < until, f"timed out waiting for {what}"
        time.sleep(0.02)


def _events(tmp_path, kind):
    return [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == kind]


# issue 9, defect 1
def test_the_snapshot_thread_survives_a_disk_or_descriptor_failure(live, monkeypatch):
    service, _, died, tmp_path = live
    real, fails = runtime_mod.write_snapshot, {"n": 2}

    def flaky(*a, **kw):
        if fails["n"] > 0:
            fails["n"] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real(*a, **kw)

    monkeypatch.setattr(runtime_mod, "write_snapshot", flaky)
    start = time.time()
    _wait(lambda: len(_events(tmp_path, "snapshot_failed")) >= 2, "two failed snapshots")
    _wait(lambda: any(e["t"] > start for e in _events(tmp_path, "snapshot")), "a snapshot after")
    assert not died


# issue 9, defect 2
def test_refused_calls_with_long_method_names_cannot_fill_the_log(live):
    service, stub, _, tmp_path = live
    log = tmp_path / "events.jsonl"
    size0 = log.stat().st_size
    ch = open_channel(f"127.0.0.1:{service.port}", "control", None)
    call = ch.unary_unary("/" + "m" * 7000)
    for _ in range(200):
        with pytest.raises(grpc.RpcError):
            call(b"", metadata=(("x-atoll-token", "wrong"),), timeout=5)
    ch.close()
    assert log.stat().st_size - size0 < 20_000  # before the fix: ~1.4 MB
    service.stop(final_dir=tmp_path)
    assert service.final_accounts()["auth_refused"] == 200  # every one counted


# issue 9, defects 5 and 8
def test_heartbeats_without_a_session_change_nothing(live):
    service, stub, _, tmp_path = live
    for i in range(300):
        reply = stub.Heartbeat(
            pb.Beat(learner=f"ghost-{i}", incarnation="x", tokens=(1 << 63) - 1, step=1),
            metadata=MD,
            timeout=5,
        )
        assert not reply.known and not reply.stop
    assert reply.remaining == 10_000
    acct = service.final_accounts()
    assert acct["tokens"] == {} and len(json.dumps(acct)) < 2_000


# issue 9, defect 5
def test_a_joined_learner_cannot_end_the_budget_with_one_beat(live):
    service, stub, _, _ = live
    join = stub.Join(pb.Hello(protocol=PROTOCOL, learner="L0", incarnation="i0"), metadata=MD)
    next(join)  # the welcome: joined
    reply = stub.Heartbeat(
        pb.Beat(learner="L0", incarnation="i0", tokens=(1 << 63) - 1, step=1),
        metadata=MD,
        timeout=5,
    )
    assert reply.known and not reply.stop and reply.remaining == 10_000
    join.cancel()


# issue 28: learners joining a 100M syncer together were all dropped 3 s after they joined
def test_a_join_that_waited_for_the_lock_is_not_dropped_for_the_time_it_waited(live, monkeypatch):
    """A learner's silence counts from its admission, not from its call: a join that waited
    longer than lost_after_s (1 s here) behind the lock is not lost the moment it is in."""
    service, stub, _, _ = live
    real = service.runtime.proto.on_join

    def slow(*a, **k):  # what the lock's other holders (a heal's encode, a close) cost it
        time.sleep(1.5)
        return real(*a, **k)

    monkeypatch.setattr(service.runtime.proto, "on_join", slow)
    join = stub.Join(pb.Hello(protocol=PROTOCOL, learner="L0", incarnation="i0"), metadata=MD)
    next(join)  # the welcome
    time.sleep(0.5)  # two rounds of the reaper, still within lost_after_s of the admission
    reply = stub.Heartbeat(pb.Beat(learner="L0", incarnation="i0", step=1), metadata=MD, timeout=5)
    assert reply.known
    join.cancel()


def test_a_learner_reading_a_long_heal_is_not_dropped_as_silent(live):
    """A learner sends no heartbeat before it has a model (a heal of 100M parameters takes
    seconds on a slow link): each heal message it takes refreshes its session. Read here
    for about twice lost_after_s, a message every 50 ms."""
    service, stub, _, _ = live

    class Context:  # what the Join handler uses of gRPC's
        def add_callback(self, fn):
            pass

        def abort(self, code, details):
            raise AssertionError(details)

    service.handlers._welcome.chunk_bytes = 64  # the heal in many messages
    hello = pb.Hello(protocol=PROTOCOL, learner="L0", incarnation="i0")
    stream = service.handlers.Join(hello, Context())
    assert next(stream).WhichOneof("body") == "welcome"
    t0, read = time.time(), 0
    for msg in stream:
        read += 1
        if msg.WhichOneof("body") == "update" and msg.update.fragment == CFG.P - 1:
            break
        time.sleep(0.05)
    assert time.time() - t0 > 2.0 and read > 40  # longer than lost_after_s (1 s)
    reply = stub.Heartbeat(pb.Beat(learner="L0", incarnation="i0", step=1), metadata=MD, timeout=5)
    assert reply.known


# issue 9, defect 7
def test_pulls_streams_without_a_session_are_closed_and_bounded(live):
    service, stub, _, tmp_path = live
    calls = [
        stub.Pulls(
            pb.ControlHello(protocol=PROTOCOL, learner=f"nobody-{i}", incarnation="x"),
            metadata=MD,
        )
        for i in range(6)
    ]
    for c in calls:
        next(c)  # registered
    extra = stub.Pulls(
        pb.ControlHello(protocol=PROTOCOL, learner="one-too-many", incarnation="x"), metadata=MD
    )
    with pytest.raises(grpc.RpcError) as err:
        next(extra)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    ended = []
    for c in calls:  # the reaper closes each within ~lost_after_s (1 s)
        try:
            for _ in c:
                pass
            ended.append(True)
        except grpc.RpcError:
            ended.append(True)
    assert len(ended) == 6
    assert stub.Status(pb.StatusRequest(), metadata=MD, timeout=5).rounds == 0


# issue 9, defect 6
def test_a_join_from_a_foreign_epoch_counts_no_lost_rounds(live):
    service, stub, _, _ = live
    P = service.proto.plan.P
    hello = pb.Hello(
        protocol=PROTOCOL, learner="L5", incarnation="i5", epoch="not-this-run", resume=True,
        base_versions=[0] * P, latest_versions=[10**12] * P,
    )  # fmt: skip
    join = stub.Join(hello, metadata=MD)
    next(join)
    assert service.final_accounts()["lost_committed_rounds"] == 0
    join.cancel()


def _merge_two(service, stub):
    """Join L0 and L1 and make fragment 0 merge once (quorum 2); returns their streams."""
    streams = []
    for lid in ("L0", "L1"):
        call = stub.Join(pb.Hello(protocol=PROTOCOL, learner=lid, incarnation=lid), metadata=MD)
        streams.append(call)
        next(call)
    n = service.proto.plan.fragments[0].numel
    for lid in ("L0", "L1"):
        payload = codec.encode(1e-3 * torch.randn(n), "int4")
        from atoll.wire.chunks import crc32

        h = pb.ContributionHeader(
            protocol=PROTOCOL, learner=lid, incarnation=lid, fragment=0, seq=1,
            base_version=0, steps=1, tokens=64, sent_at=time.time(), step_time=0.1,
            total_bytes=len(payload), crc32=crc32(payload),
        )  # fmt: skip
        try:
            stub.PushOne(pb.Single(header=h, payload=payload), metadata=MD, timeout=3)
        except grpc.RpcError:  # the syncer "exited" (the test's exit) while answering it
            pass
    return streams


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_disk_full_tape_ends_the_syncer_before_the_round_is_sent(live, monkeypatch):
    service, stub, died, tmp_path = live
    rt = service.runtime

    def full(body):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rt.tape, "append", full)
    streams = _merge_two(service, stub)
    assert died == [runtime_mod.EXIT_DISK]
    assert _events(tmp_path, "disk_failed") and not _events(tmp_path, "round_closed")
    # nothing of the round that could not be recorded was queued to any learner
    assert all(not s.updates for s in rt.sessions.values())
    for s in streams:
        s.cancel()
    # a real syncer is gone by now (os._exit): no final snapshot of what was never recorded
    service.stop = lambda final_dir=None: (rt.close_streams(), service.server.stop(0))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_background_thread_that_raises_takes_the_syncer_down_loudly(live, monkeypatch):
    service, stub, died, tmp_path = live

    def broken(now, key):
        raise RuntimeError("a bug in a timer")

    monkeypatch.setattr(service.runtime.proto, "on_timer", broken)
    with service.runtime.lock:
        service.runtime.process(time.time(), [SetTimer(time.time(), PullTick(0))])
    _wait(lambda: died, "the fatal exit")
    assert died == [runtime_mod.EXIT_THREAD_DIED]
    assert _events(tmp_path, "thread_died")[0]["data"]["thread"] == "_timer_loop"
    assert threading.active_count() > 0


def test_a_syncer_whose_welcome_cannot_be_used_stops_the_learner_loudly():
    """Left over from issue 9: a Welcome the learner cannot use (here H = 0) was a transfer
    error, and the learner rejoined every 2 s for ever (`Learner()` waited out its 60 s
    connect timeout). Now a few in a row end it with the reason."""
    from concurrent import futures

    from atoll.errors import JoinError
    from atoll.live.learner import Learner, LearnerOptions
    from atoll.model.recipe import new_model

    joins = []

    class Unusable(pbg.SyncerServicer):
        def Join(self, hello, context):  # noqa: N802
            joins.append(time.time())
            yield pb.Down(welcome=pb.Welcome(H=0, epoch="e"))
            time.sleep(0.05)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pbg.add_SyncerServicer_to_server(Unusable(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        model = new_model(CFG)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(JoinError, match=r"Welcome cannot be used: Welcome.H=0"):
            opts = LearnerOptions(learner_id="L0", run_id=RUN, secret=SECRET, comm="thread",
                                  connect_timeout_s=60)  # fmt: skip
            Learner(model, opt, f"127.0.0.1:{port}", opts)
        assert len(joins) == 5  # not a TimeoutError after 60 s of rejoining
    finally:
        server.stop(0)
