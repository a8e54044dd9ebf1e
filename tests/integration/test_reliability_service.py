"""Regression tests for the reliability defects of issue 9 (numbered as there), each against
the real component: the core state machine, or the live syncer service in process over gRPC
on loopback. Each fails on the code before its fix."""

from __future__ import annotations

import errno
import json
import threading
import time

import grpc
import pytest
import torch

from atoll.config import SimConfig
from atoll.core import codec
from atoll.core.events import Event
from atoll.core.messages import Contribution, Progress, Resume, SetTimer
from atoll.core.syncer import SyncerProtocol
from atoll.eventlog import read_events
from atoll.live.syncer import SyncerOptions, SyncerService
from atoll.live.syncer import runtime as runtime_mod
from atoll.model.recipe import builtin_plan
from atoll.wire import PROTOCOL
from atoll.wire import atoll_pb2 as pb
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire.auth import call_metadata, open_channel

CFG = SimConfig(
    learners=2, P=3, H=3, tau=1, quorum=2, grace=False, codec="int4", schedule="pull",
    n_layer=1, d_model=8, n_head=2, context=8, batch=2, data_bytes=200_000, eval_batches=1,
)  # fmt: skip
SECRET, RUN = "secret-0123456789", "run-r"
MD = call_metadata(RUN, SECRET)


def kinds(out, kind):
    return [o.data for o in out if isinstance(o, Event) and o.kind == kind]


def core(**kw) -> SyncerProtocol:
    plan, init = builtin_plan(CFG)
    import dataclasses

    cfg = dataclasses.replace(CFG.syncer_config(), **kw)
    s = SyncerProtocol(plan, init, cfg)
    for lid in ("L0", "L1"):
        s.on_join(0.0, lid)
    return s


def contribution(s, lid, p=0, value=None, step_time=0.1, steps=1, tokens=64, seq=1):
    n = s.plan.fragments[p].numel
    delta = torch.full((n,), value) if value is not None else 1e-3 * torch.randn(n)
    return Contribution(lid, p, seq, 0, codec.encode(delta, "int4"), steps, tokens, 1.0, step_time)


def state_bits(s) -> list:
    st = s.state_dict()
    return [
        st["rounds_closed"],
        [(f["version"], f["theta"].clone(), f["public"].clone()) for f in st["fragments"]],
    ]


def same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    return all(
        va == vb and torch.equal(ta, tb) and torch.equal(pa, pb_)
        for (va, ta, pa), (vb, tb, pb_) in zip(a[1], b[1])
    )


# -- 3. huge finite int4 values ------------------------------------------------------------------
def test_3_huge_finite_int4_frames_are_refused_and_leave_the_state_bit_identical():
    s = core()
    before = state_bits(s)
    for lid in ("L0", "L1"):
        out = s.on_contribution(1.0, contribution(s, lid, value=-3e38))
        assert [r.code for r in kinds(out, "refused")] == ["magnitude"], out
    assert same(before, state_bits(s)) and s.version == [0, 0, 0]


def test_3_a_merge_that_overflows_never_commits_even_with_the_guard_off():
    """With Nesterov, two deltas of -3e38 overflow the outer step to inf; the version used to
    move with no round event and no tape record (every later Join failed)."""
    s = core(guard=0.0, outer="nesterov", outer_lr=0.7)
    before = state_bits(s)
    out = s.on_contribution(1.0, contribution(s, "L0", value=-3e38))
    out += s.on_contribution(1.0, contribution(s, "L1", value=-3e38))
    assert not kinds(out, "round_closed") and len(kinds(out, "merge_refused")) == 1
    assert same(before, state_bits(s)) and s.version == [0, 0, 0]
    assert all(bool(torch.isfinite(t).all()) for t in s.theta)
    # the round is over: honest contributions merge as usual afterwards
    out = s.on_contribution(2.0, contribution(s, "L0", seq=2))
    out += s.on_contribution(2.0, contribution(s, "L1", seq=2))
    assert len(kinds(out, "round_closed")) == 1 and s.version[0] == 1


def test_guard_takes_ordinary_deltas_and_refuses_an_outlier_once_warm():
    s = core(quorum=1)
    for i in range(12):  # warm: the guard has seen what this run's deltas look like
        out = s.on_contribution(1.0 + i, contribution(s, "L0", seq=i + 1))
        assert not kinds(out, "refused"), out
        base = s.version[0]
    n = s.plan.fragments[0].numel
    big = Contribution(
        "L1", 0, 1, base, codec.encode(0.5 * torch.randn(n), "int4"), 1, 64, 20.0, 0.1
    )
    out = s.on_contribution(20.0, big)
    assert [r.code for r in kinds(out, "refused")] == ["magnitude"]


# -- 4. a step time of 1e300 ---------------------------------------------------------------------
def _pull_period(s, now) -> float:
    timers = [o for o in s.on_timer(now, ("pull", s.tick)) if isinstance(o, SetTimer)]
    return timers[0].at - now


def test_4_a_huge_step_time_cannot_freeze_the_pull_clock():
    s = core()
    s.on_listening(0.0, "L0", True)
    s.on_progress(0.5, Progress("L0", 1, 0.1, 0.5, 0.1))
    out = s.on_contribution(1.0, contribution(s, "L0", step_time=1e300))
    assert [r.code for r in kinds(out, "refused")] == ["header"]
    s.on_progress(1.0, Progress("L0", 2, 1e300, 1.0, 0.2))  # ignored
    s.on_progress(1.1, Progress("L0", 3, 3000.0, 1.1, 0.3))  # within bounds: moves it a bit
    assert _pull_period(s, 2.0) < 1.0  # before the fix: 1e300 s (never again)


# -- 6. a crafted Join ---------------------------------------------------------------------------
def test_6_an_implausible_seen_claim_does_not_count_as_lost_rounds():
    s = core()
    P = s.plan.P
    r = Resume((0,) * P, (10**12,) * P, other_epoch=True, keep_progress=True)
    out = s.on_join(1.0, "L9", r)
    checks = kinds(out, "seen_check")
    assert checks[0].lost_committed_rounds == 0 and "implausible" in checks[0].implausible
    short = Resume((0,), (5,), other_epoch=True, keep_progress=True)  # wrong length: heals
    out = s.on_join(2.0, "L8", short)
    assert kinds(out, "joined")[0].learner == "L8"


# -- 11. the encoder's error feedback on a fragment that stops changing --------------------------
def test_11_error_feedback_survives_a_fragment_that_stops_changing():
    """Its residual shrinks ~14x per int4 frame; once a group's scale underflowed bf16 the
    sender's own copy of what it sent became NaN and every later frame was refused (the
    upload thread died around step 1,000-2,000 of `learners=1 steps=4000`)."""
    ef = codec.ErrorFeedback("int4", 64)
    ef.encode(0, 1e-3 * torch.randn(256))
    for _ in range(200):
        frame = ef.encode(0, torch.zeros(256))
        assert bool(torch.isfinite(ef.residual[0]).all())
    assert torch.equal(codec.decode(frame), torch.zeros(256))
    x = torch.zeros(128)
    x[3], x[70] = 1e-41, 0.5  # one group of a subnormal absmax
    frame, sent = codec._encode(x, "int4", 64, want_sent=True)
    assert torch.equal(sent, codec.decode(frame))


# -- the live syncer in process -----------------------------------------------------------------
@pytest.fixture
def live(tmp_path):
    plan, init = builtin_plan(CFG)
    kw = dict(lost_after_s=1.0, snapshot_every_s=0.2, token_budget=10_000, max_learners=6)
    known = SyncerOptions.__dataclass_fields__  # (the same test runs against older code)
    opts = SyncerOptions(tmp_path, RUN, SECRET, **{k: v for k, v in kw.items() if k in known})
    service = SyncerService(plan, init, CFG.syncer_config(), CFG.learner_config(), opts)
    died: list[int] = []

    def exit_(code: int) -> None:
        died.append(code)

    service.runtime.exit = exit_
    port = service.start()
    ch = open_channel(f"127.0.0.1:{port}", "control", None)
    yield service, pbg.SyncerStub(ch), died, tmp_path
    ch.close()
    service.stop(final_dir=tmp_path)


def _wait(cond, what, timeout=15.0):
    until = time.time() + timeout
    while not cond():
        assert time.time() < until, f"timed out waiting for {what}"
        time.sleep(0.02)


def _events(tmp_path, kind):
    return [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == kind]


def test_1_the_snapshot_thread_survives_a_disk_or_descriptor_failure(live, monkeypatch):
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


def test_2_refused_calls_with_long_method_names_cannot_fill_the_log(live):
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


def test_5_and_8_heartbeats_without_a_session_change_nothing(live):
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


def test_5_a_joined_learner_cannot_end_the_budget_with_one_beat(live):
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


def test_7_pulls_streams_without_a_session_are_closed_and_bounded(live):
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


def test_6_a_join_from_a_foreign_epoch_counts_no_lost_rounds(live):
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
        service.runtime.process(time.time(), [SetTimer(time.time(), ("pull", 0))])
    _wait(lambda: died, "the fatal exit")
    assert died == [runtime_mod.EXIT_THREAD_DIED]
    assert _events(tmp_path, "thread_died")[0]["data"]["thread"] == "_timer_loop"
    assert threading.active_count() > 0


# -- 10. the learner's communication process killed ----------------------------------------------
def test_10_a_learner_whose_communication_process_dies_stops_loudly(live):
    """Before: it logged `comm_fatal` and trained offline for the rest of the run, alive,
    so its supervisor never restarted it. Now `step()` raises CommError (the process exits
    non-zero and is restarted; it then heals)."""
    from atoll.errors import CommError
    from atoll.live.learner import Learner
    from atoll.model.recipe import new_model

    service, _, _, tmp_path = live
    model = new_model(CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    addr = f"127.0.0.1:{service.port}"
    events = tmp_path / "events.jsonl"
    learner = Learner(
        model, opt, addr, learner_id="L0", run_id=RUN, secret=SECRET, comm="process",
        events=str(events),
    )  # fmt: skip
    learner.step(tokens=16)
    learner.port.proc.kill()
    learner.port.proc.wait()
    with pytest.raises(CommError):
        for _ in range(200):
            learner.step(tokens=16)
            time.sleep(0.01)
    learner.close()
    assert any(e["kind"] == "comm_fatal" for e in read_events(events))


# -- load: reconnect storms, sessions that never listen ------------------------------------------
def test_a_storm_of_rejoins_encodes_each_heal_frame_once():
    s = core()
    first = s.heal_message()
    again = s.heal_message()
    assert all(a.payload is b.payload for a, b in zip(first.updates, again.updates))


def test_a_session_that_never_listens_does_not_hold_rounds_open():
    """Pull schedule, quorum 1 with a grace window: a round closes once every learner that
    can hear pulls has sent; before, a joined session without a Pulls stream (a client
    that rejoins in a loop) kept every round open for the whole window."""
    s = core(quorum=1, grace=True)
    s.on_join(0.0, "storm", listening=False)
    s.grace.step.value, s.grace.to_quorum.value, s.grace.sync.value = 1.0, 0.0, 0.0
    out = s.on_contribution(1.0, contribution(s, "L0"))
    assert not kinds(out, "round_closed")  # L1 listens: the window waits for it
    out = s.on_contribution(1.1, contribution(s, "L1"))
    assert len(kinds(out, "round_closed")) == 1  # not waiting for "storm"


def test_a_syncer_whose_welcome_cannot_be_used_stops_the_learner_loudly():
    """Left over from issue 9: a Welcome the learner cannot use (here H = 0) was a transfer
    error, and the learner rejoined every 2 s for ever (`Learner()` waited out its 60 s
    connect timeout). Now a few in a row end it with the reason."""
    from concurrent import futures

    from atoll.live.learner import Learner
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
        with pytest.raises(ConnectionError, match=r"Welcome cannot be used: Welcome.H=0"):
            Learner(model, opt, f"127.0.0.1:{port}", learner_id="L0", run_id=RUN,
                    secret=SECRET, comm="thread", connect_timeout_s=60)  # fmt: skip
        assert len(joins) == 5  # not a TimeoutError after 60 s of rejoining
    finally:
        server.stop(0)
