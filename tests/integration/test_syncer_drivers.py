"""One scripted sequence of inputs (joins, a step report that starts the pull clock, pulls,
contributions, a refusal, a lost learner, a rejoin, the token budget spent and both learners
leaving) through the virtual-time driver's syncer side and through the live syncer service (in
process, gRPC on loopback): the same pulls, merges, versions, weights, refusals, the
bit-identical global value, and the same end of the run (core/budget.py)."""

from __future__ import annotations

import threading
import time

import torch

from atoll.config import SimConfig
from atoll.core import codec
from atoll.core.messages import Contribution, Progress, Pull
from atoll.eventlog import load_events
from atoll.live.syncer import SyncerOptions, SyncerService
from atoll.sim import queue
from atoll.sim.decoupled import DecoupledSim
from atoll.wire import PROTOCOL, convert
from atoll.wire import atoll_pb2 as pb
from atoll.wire import atoll_pb2_grpc as pbg
from atoll.wire.auth import call_metadata, open_channel

CFG = SimConfig(
    learners=2, P=3, H=3, tau=1, quorum=2, grace=False, codec="fp32", schedule="pull",
    n_layer=1, d_model=8, n_head=2, context=8, batch=2, data_bytes=200_000, eval_batches=1,
)  # fmt: skip
STEP_S = 30.0  # the reported step time: the pull clock's next tick is far beyond the test


def _script(plan) -> list[tuple]:
    """(action, learner, args): deltas are seeded, so both drivers get the same bytes."""
    gen = torch.Generator().manual_seed(7)

    def contrib(lid: str, p: int, seq: int, base: int, tokens: int, steps: int) -> tuple:
        delta = 0.01 * torch.randn(plan.fragments[p].numel, generator=gen)
        payload = codec.encode(delta, "fp32")
        return ("contribute", lid, (p, seq, base, payload, steps, tokens))

    return [
        ("progress", "L0", (1, STEP_S, STEP_S)),
        contrib("L0", 0, 1, 0, 300, 3),
        contrib("L1", 0, 1, 0, 100, 1),  # quorum 2: fragment 0 merges [L0, L1]
        contrib("L0", 1, 2, 0, 64, 1),  # waits for L1 ...
        ("lose", "L1", ()),  # ... which is lost: fragment 1 merges [L0] alone
        contrib("L0", 2, 3, 99, 64, 1),  # base version never held: refused (must heal)
        ("join", "L1", ()),  # a fresh L1: heals
        contrib("L1", 2, 1, 0, 50, 2),
        contrib("L0", 2, 4, 0, 70, 1),  # fragment 2 merges [L0, L1]
        contrib("L1", 0, 2, 1, 20, 1),  # base version 1 of fragment 0: staleness 0
        contrib("L0", 0, 5, 0, 20, 1),  # base 0, one merge behind: staleness 1
        ("tokens", "L0", (CFG.budget_tokens(),)),  # the budget spent: not over, both live
        ("leave", "L0", ()),  # each learner ends its session after its final flush ...
        ("leave", "L1", ()),  # ... and once the last has left, the run is over
    ]


def _summary(events, syncer) -> dict:
    rounds = [
        (e.data.fragment, e.data.version, e.data.participants, e.data.weights, e.data.staleness)
        for e in events
        if e.kind == "round_closed"
    ]
    refused = [
        (e.data.learner, e.data.fragment, e.data.code) for e in events if e.kind == "refused"
    ]
    over = [(e.data.reason, e.data.left) for e in events if e.kind == "run_over"]
    return {
        "rounds": rounds,
        "refused": refused,
        "over": over,
        "versions": list(syncer.version),
        "theta": [t.clone() for t in syncer.theta],
    }


def run_virtual(script) -> tuple[dict, list]:
    sim = DecoupledSim(CFG)
    now = 0.0
    pulls = []
    for lr in sim.learners:
        sim.syncer_outputs(now, sim.syncer.on_join(now, lr.id))
    for action, lid, args in script:
        now += 0.01
        lr = sim.by_id[lid]
        if action == "progress":
            sim.on_up(now, lr, Progress(lid, args[0], args[1], now, args[2]))
        elif action == "contribute":
            p, seq, base, payload, steps, tokens = args
            c = Contribution(lid, p, seq, base, payload, steps, tokens, now, STEP_S)
            sim.on_up(now, lr, c)
        elif action == "lose":
            sim.fail(now, lr, 1.0)
        elif action == "join":
            sim.recover(now, lr)
        elif action == "tokens":
            sim.counted(now, args[0], lr)
            assert not sim.syncer.run_over(now)
        elif action == "leave":
            sim.leave(now, lr)
        # the syncer's timers now due (the pull clock), as the driver's loop runs them
        for t, timer in sim.queue.take(now, queue.Timer):
            sim.syncer_outputs(t, sim.syncer.on_timer(t, timer.key))
    for _, item in sim.queue:
        if isinstance(item, queue.Down) and isinstance(item.message, Pull):
            pulls.append((item.learner, item.message.fragment, item.message.tick))
    return _summary(sim.events, sim.syncer), sorted(pulls)


class _Stream(threading.Thread):
    """Reads a server stream in the background, keeping every message."""

    def __init__(self, call) -> None:
        super().__init__(daemon=True)
        self.call, self.items = call, []
        self.start()

    def run(self) -> None:
        try:
            for msg in self.call:
                self.items.append(msg)
        except Exception:  # noqa: BLE001 - cancelled by the test
            pass


def _wait(cond, what: str, timeout: float = 20.0) -> None:
    until = time.time() + timeout
    while not cond():
        assert time.time() < until, f"timed out waiting for {what}"
        time.sleep(0.01)


def run_live(script, plan, init, tmp_path) -> tuple[dict, list]:
    opts = SyncerOptions(tmp_path, "run", "secret-123", lost_after_s=60.0, snapshot_every_s=600.0,
                         token_budget=CFG.budget_tokens())  # fmt: skip
    cfg = CFG
    service = SyncerService(plan, init, cfg.syncer_config(), cfg.learner_config(), opts)
    port = service.start()
    md = call_metadata("run", "secret-123")
    stub = pbg.SyncerStub(open_channel(f"127.0.0.1:{port}", "bulk", None))
    inc = {"L0": "L0-a", "L1": "L1-a"}
    joins, controls, streams = {}, {}, []

    def join(lid: str) -> None:
        hello = pb.Hello(protocol=PROTOCOL, learner=lid, incarnation=inc[lid])
        joins[lid] = _Stream(stub.Join(hello, metadata=md))
        _wait(lambda: len(joins[lid].items) >= 1 + plan.P, f"{lid}'s heal")
        ctl = pb.ControlHello(protocol=PROTOCOL, learner=lid, incarnation=inc[lid])
        controls[lid] = _Stream(stub.Pulls(ctl, metadata=md))
        streams.append((lid, controls[lid]))
        _wait(lambda: len(controls[lid].items) >= 1, f"{lid}'s Pulls stream")

    try:
        for lid in ("L0", "L1"):
            join(lid)
        for action, lid, args in script:
            if action == "progress":
                beat = pb.Beat(learner=lid, incarnation=inc[lid], step=args[0],
                               step_time=args[1], work_s=args[2])  # fmt: skip
                stub.Heartbeat(beat, metadata=md)
                _wait(lambda: all(len(c.items) >= 2 for c in controls.values()), "the pulls")
            elif action == "contribute":
                p, seq, base, payload, steps, tokens = args
                c = Contribution(lid, p, seq, base, payload, steps, tokens, time.time(), STEP_S)
                req = pb.Single(header=convert.contribution_header(c, inc[lid]), payload=payload)
                stub.PushOne(req, metadata=md)
            elif action == "tokens":  # this learner's counters, as its heartbeat reports them
                beat = pb.Beat(learner=lid, incarnation=inc[lid], step=1, step_time=STEP_S,
                               tokens=args[0], work_s=STEP_S)  # fmt: skip
                stub.Heartbeat(beat, metadata=md)
                assert not service.runtime.over.is_set()
            elif action in ("lose", "leave"):
                joins[lid].call.cancel()
                controls[lid].call.cancel()
                _wait(lambda lid=lid: lid not in service.proto.live, f"{lid} lost")
            elif action == "join":
                inc[lid] = lid + "-b"
                join(lid)
        pulls = [
            (lid, x.fragment, x.tick) for lid, c in streams for msg in c.items for x in msg.pulls
        ]
        with service.lock:
            out = _summary([], service.proto)
    finally:
        service.stop()
    logged = _summary(load_events(tmp_path / "events.jsonl"), service.proto)
    out["rounds"], out["refused"] = logged["rounds"], logged["refused"]
    out["over"] = logged["over"]
    assert service.runtime.over.is_set()
    return out, sorted(pulls)


def test_same_inputs_same_merges_under_both_drivers(tmp_path):
    sim = DecoupledSim(CFG)  # the plan and initial values both drivers start from
    init = [t.clone() for t in sim.syncer.theta]
    script = _script(sim.plan)
    virtual, v_pulls = run_virtual(script)
    live, l_pulls = run_live(script, sim.plan, init, tmp_path)
    assert [r[:3] for r in virtual["rounds"]] == [
        (0, 1, ["L0", "L1"]),
        (1, 1, ["L0"]),
        (2, 1, ["L0", "L1"]),
        (0, 2, ["L0", "L1"]),
    ]
    assert virtual["rounds"][-1][4] == [1, 0]  # L0 based on version 0, L1 on version 1
    assert virtual["refused"] == [("L0", 2, "stale_base")]
    # the pull clock started by L0's report pulls fragment 0 (offset 0) from both learners
    assert {(lid, f) for lid, f, _ in v_pulls} == {("L0", 0), ("L1", 0)}
    assert live["rounds"] == virtual["rounds"]
    assert live["refused"] == virtual["refused"]
    assert live["versions"] == virtual["versions"] == [2, 1, 1]
    assert l_pulls == v_pulls
    assert live["over"] == virtual["over"] == [("flushed", None)]
    for a, b in zip(live["theta"], virtual["theta"], strict=True):
        assert torch.equal(a, b)
