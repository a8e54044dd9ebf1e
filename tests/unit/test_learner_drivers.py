"""The learner side under both drivers: one scripted sequence (steps, pulls, a wait for an answer
with a pull answered while waiting, updates in full and as deltas, a refusal that asks for a
heal, a syncer restart with a resume, the token budget spent and the final flush) through the
virtual-time driver's learner (`DecoupledSim`) and the live `Learner` (in process: its
transport to the communication side is a scripted one, everything above it is the library's)
gives the same sends, in the same order, with the same bases, counters and deltas, the same
applied fragments and the bit-identical final parameters."""

from __future__ import annotations

import itertools
import math

import torch

from atoll.config import SimConfig
from atoll.core import codec
from atoll.core.budget import TokenBudget
from atoll.core.events import Applied, Blocked, Event, PushRefused
from atoll.core.learner import HealRequest, Phase
from atoll.core.messages import FragmentUpdate, Heal, Outgoing, Pull, Resumed
from atoll.live.comm.messages import (
    BeatDone,
    BeatOnce,
    CommStatus,
    HealReceived,
    NotSent,
    PullReceived,
    RefusalReceived,
    RequestHeal,
    StepState,
    Submit,
    UpdateReceived,
    Welcomed,
)
from atoll.live.learner import Learner, LearnerOptions
from atoll.model.recipe import new_model
from atoll.sim.decoupled import DecoupledSim
from atoll.wire import convert

CFG = SimConfig(
    learners=1, P=3, H=3, tau=1, quorum=1, codec="fp32", schedule="pull",
    n_layer=1, d_model=8, n_head=2, context=8, batch=2, data_bytes=200_000, eval_batches=1,
)  # fmt: skip
TOKENS = 16  # per step


class ScriptedPort:
    """The live learner's transport, fed by the script: `now` items are there at the next
    step boundary, `later` ones arrive while the learner waits for an answer."""

    def __init__(self) -> None:
        self.now: list = []
        self.later: list = []
        self.sent: list[tuple] = []  # what the learner handed over, in order
        self.steps: list[StepState] = []  # its step reports

    def send(self, msg: object) -> None:
        if isinstance(msg, StepState):
            self.steps.append(msg)
        elif isinstance(msg, RequestHeal):
            self.sent.append(("heal_request",))
        elif isinstance(msg, BeatOnce):
            self.later.append(BeatDone(True))

    def layout(self, numels: list[int]) -> None:
        pass

    def submit(self, o: Outgoing) -> Submit:
        self.sent.append(("contribution", o))
        return Submit(o)

    delta_buffer = None  # deltas are new tensors

    def value_in(self, p: int, value: object, copy: bool = True) -> None:
        return None

    def done_with(self, value: object) -> None:
        pass

    def get_all(self) -> list:
        out, self.now = self.now, []
        return out

    def get(self, timeout: float) -> object | None:
        if self.now:
            return self.now.pop(0)
        return self.later.pop(0) if self.later else None

    def close(self) -> None:
        pass


class ScriptedLearner(Learner):
    """The live learner library, over the scripted transport."""

    def __init__(self, port: ScriptedPort, model: torch.nn.Module) -> None:
        self.scripted = port
        opts = LearnerOptions(learner_id="L0", secret="scripted-secret", wait_s=math.inf)
        super().__init__(model, None, "127.0.0.1:1", opts)

    def _open_port(self, comm: str, opts: object) -> ScriptedPort:
        return self.scripted


def _script(plan, init: list[torch.Tensor]) -> list[tuple]:
    """(when, message): "now" arrives during the next step (taken at its boundary), "wait"
    while it waits after a step; "step": an inner step, then its boundary."""
    gen = torch.Generator().manual_seed(3)

    def value(p: int) -> torch.Tensor:
        return init[p] + 0.01 * torch.randn(plan.fragments[p].numel, generator=gen)

    def full(p: int, version: int, included: tuple = ()) -> FragmentUpdate:
        return FragmentUpdate(p, version, "full", version, codec.encode(value(p), "fp32"),
                              included, 0.0)  # fmt: skip

    def delta(p: int, version: int, included: tuple = ()) -> FragmentUpdate:
        d = 0.001 * torch.randn(plan.fragments[p].numel, generator=gen)
        return FragmentUpdate(p, version, "delta", version - 1, codec.encode(d, "fp32"),
                              included, 0.0)  # fmt: skip

    heal = Heal(tuple(full(p, 0) for p in range(plan.P)))
    return [
        ("heal", heal),
        ("step",),
        ("now", Pull(0, 0, 0.0)),
        ("step",),  # sends fragment 0 (seq 1)
        ("step",),  # tau = 1: the answer is due now: it waits ...
        ("wait", Pull(1, 1, 0.0)),  # ... answers this pull at once, idle ...
        ("wait", full(0, 1, (("L0", 1),))),  # ... and steps on once fragment 0 is answered
        ("now", delta(1, 1, (("L0", 2),))),
        ("step",),  # fragment 1 applied
        ("now", Pull(2, 2, 0.0)),
        ("step",),  # sends fragment 2 (seq 3)
        ("refused", 2, "base version 7 is not held", "heal"),  # asks for a heal ...
        ("now", Heal((full(0, 1), full(1, 1), full(2, 0)))),  # ... which comes
        ("step",),
        ("now", Pull(2, 3, 0.0)),
        ("step",),  # sends fragment 2 (seq 4)
        ("restart", full(1, 2)),  # the syncer restarted; it resumes: ...
        ("step",),  # ... fragment 2 is sent again at the boundary
        ("step",),  # its answer is due: it waits
        ("wait", full(2, 1, (("L0", 5),))),
        ("now", Pull(0, 4, 0.0)),
        ("step",),  # sends fragment 0 (based on version 1)
        ("now", delta(0, 2, (("L0", 6),))),
        ("stop",),  # the token budget is spent: the final flush at the next boundary
        ("step",),
    ]


def _perturb(model: torch.nn.Module, k: int) -> None:
    """The same inner step for both drivers' models: seeded, deterministic."""
    gen = torch.Generator().manual_seed(100 + k)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=gen))


def _sends(items: list[tuple]) -> list[tuple]:
    out = []
    for item in items:
        if item[0] == "heal_request":
            out.append(item)
            continue
        o = item[1]
        out.append((o.fragment, o.seq, o.base_version, o.steps, o.tokens, o.generation, o.delta))
    return out


def run_virtual(script) -> tuple[list, list, dict]:
    sim = DecoupledSim(CFG)
    learner = sim.learners[0]
    sent: list[tuple] = []
    send_up = sim._send_up

    def record(now, who, o) -> None:
        if isinstance(o, Outgoing):
            sent.append(("contribution", o))
        elif isinstance(o, HealRequest):
            sent.append(("heal_request",))
        send_up(now, who, o)

    sim._send_up = record
    now, k, epoch = 0.0, 0, 0
    arrived: list[tuple] = []  # during the step in progress: taken before its boundary

    def deliver(item: tuple) -> None:
        nonlocal epoch
        match item:
            case ("now" | "wait" | "heal", msg):
                sim.receive(now, learner, msg, epoch)
            case ("refused", p, reason, action):
                sim._learner_outputs(now, learner, learner.proto.on_refused(now, p, reason, action))
            case ("restart", update):
                epoch = sim.faults.syncer_epoch = 1
                sim.receive(now, learner, Resumed((update,)), epoch)

    deliver(script[0])
    for item in script[1:]:
        now += 0.1
        match item:
            case ("step",):
                k += 1
                _perturb(learner.model, k)
                for x in arrived:
                    deliver(x)
                arrived.clear()
                sim.stepped(now, learner, TOKENS, 0.1)
            case ("wait", _):
                deliver(item)
            case ("stop",):
                # spent by the next step (the syncer's budget: core/budget.py)
                sim.syncer.end.budget = TokenBudget(sim.tokens + TOKENS)
            case _:
                arrived.append(item)
    assert learner.phase is Phase.DONE
    return _sends(sent), _applied(sim.events), dict(learner.model.named_parameters())


def run_live(script, model: torch.nn.Module, plan) -> tuple[list, list, dict]:
    port = ScriptedPort()
    welcome = convert.welcome(plan, CFG.learner_config(), "epoch-1", True, 1 << 16, 1 << 24)
    port.now += [Welcomed(welcome.SerializeToString()), HealReceived(script[0][1])]
    events: list[Event] = []
    learner = ScriptedLearner(port, model)
    learner.events.write = events.append
    seq = k = 0
    for i, item in enumerate(script[1:], start=1):
        match item:
            case ("step",):
                k += 1
                _perturb(model, k)
                waits = itertools.takewhile(lambda x: x[0] == "wait", script[i + 1 :])
                port.later += [_received(x[1]) for x in waits]  # they come while it waits
                learner.step(TOKENS)
                assert not port.later  # it waited for them, as the virtual-time learner did
            case ("now", msg):
                port.now.append(_received(msg))
            case ("wait", _):
                pass
            case ("refused", p, reason, action):
                port.now.append(RefusalReceived(p, reason, action))
            case ("restart", update):
                w = convert.welcome(plan, CFG.learner_config(), "epoch-2", False, 1 << 16, 1 << 24)
                port.now += [Welcomed(w.SerializeToString()), UpdateReceived(update)]
            case ("stop",):
                seq += 1
                port.now.append(CommStatus(seq=seq, stop=True))
    assert learner.should_stop and learner.proto.phase is Phase.DONE
    assert any(isinstance(e.data, PushRefused) for e in events)
    return _sends(port.sent), _applied(events), dict(model.named_parameters())


def _received(msg: object) -> object:
    """What the communication side hands the training side for a syncer message."""
    if isinstance(msg, Pull):
        return PullReceived(msg, 0.0)
    return HealReceived(msg) if isinstance(msg, Heal) else UpdateReceived(msg)


def _applied(events: list[Event]) -> list[tuple]:
    """What was applied, and how many waits, in order."""
    out = []
    for e in events:
        if isinstance(e.data, Applied):
            out.append((e.data.fragment, e.data.version))
        elif isinstance(e.data, Blocked):
            out.append(("blocked",))
    return out


def test_one_script_gives_the_same_sends_and_parameters_under_both_drivers():
    sim = DecoupledSim(CFG)
    plan = sim.plan
    init = [plan.flatten(dict(sim.learners[0].model.named_parameters()), p) for p in range(3)]
    script = _script(plan, init)
    v_sends, v_applied, v_params = run_virtual(script)
    model = new_model(CFG)
    l_sends, l_applied, l_params = run_live(script, model, plan)

    # what the script makes the protocol do, under either driver
    assert [s[:2] if s[0] != "heal_request" else s for s in v_sends] == [
        (0, 1),  # pulled
        (1, 2),  # pulled while it waited: answered at once
        (2, 3),  # pulled
        ("heal_request",),  # the refusal's action
        (2, 4),  # pulled after the heal
        (2, 5),  # the syncer restarted: the unanswered send goes again
        (0, 6),  # pulled
        (0, 7),  # the final flush: every fragment with unsent work
        (1, 8),
        (2, 9),
    ]
    assert v_applied == [("blocked",), (0, 1), (1, 1), ("blocked",), (2, 1), (0, 2)]
    assert v_sends[5][2] == v_sends[4][2] == 0  # sent again from the same base
    assert v_sends[4][5] == 2 and v_sends[2][5] == 1  # the heal began a generation
    assert v_sends[6][2] == 1  # fragment 0 is based on the version it applied
    # ... and the same under both
    assert len(l_sends) == len(v_sends)
    for a, b in zip(l_sends, v_sends, strict=True):
        assert a[:6] == b[:6]
        if a[0] != "heal_request":
            assert torch.equal(a[6], b[6])
    assert l_applied == v_applied
    for name, value in v_params.items():
        assert torch.equal(l_params[name], value), name


def test_a_budget_answer_that_comes_before_the_first_heal_is_kept():
    """The syncer answers heartbeats sent while the learner waits for its first heal: its
    share of the budget counts once the learner trains (here: one step of it): the step's
    report asks the syncer at once, and the learner stops when the syncer says so."""
    sim = DecoupledSim(CFG)
    plan = sim.plan
    init = [plan.flatten(dict(sim.learners[0].model.named_parameters()), p) for p in range(3)]
    heal = _script(plan, init)[0][1]
    port = ScriptedPort()
    welcome = convert.welcome(plan, CFG.learner_config(), "epoch-1", True, 1 << 16, 1 << 24)
    answer = CommStatus(seq=1, budget=(0, 2 * TOKENS, 2))  # TOKENS left to each of 2
    port.now += [answer, Welcomed(welcome.SerializeToString()), HealReceived(heal)]
    learner = ScriptedLearner(port, new_model(CFG))
    assert not learner.should_stop
    learner.step(TOKENS)
    assert [m.ask for m in port.steps] == [False, True]  # the heal's report, then the step's
    assert not learner.should_stop  # its share trained: it asks, it does not stop by itself
    port.now.append(CommStatus(seq=2, stop=True))
    learner.step(TOKENS)
    assert learner.should_stop and learner.proto.phase is Phase.DONE
    assert [o.fragment for _, o in port.sent] == [0, 1, 2]  # the final flush


def test_a_contribution_that_did_not_encode_is_the_protocols_to_decide():
    """The live communication side says only that a contribution did not encode (NotSent);
    the learner protocol makes it a refusal and asks for a heal (`on_unsendable`), as under
    the virtual-time driver (tests/unit/test_sim.py)."""
    sim = DecoupledSim(CFG)
    plan = sim.plan
    init = [plan.flatten(dict(sim.learners[0].model.named_parameters()), p) for p in range(3)]
    port = ScriptedPort()
    welcome = convert.welcome(plan, CFG.learner_config(), "epoch-1", True, 1 << 16, 1 << 24)
    port.now += [Welcomed(welcome.SerializeToString()), HealReceived(_script(plan, init)[0][1])]
    events: list[Event] = []
    learner = ScriptedLearner(port, new_model(CFG))
    learner.events.write = events.append
    port.now.append(NotSent(1, "payload holds non-finite values"))
    learner.step(TOKENS)
    assert port.sent == [("heal_request",)] and learner.refused == 1
    (refused,) = [e.data for e in events if isinstance(e.data, PushRefused)]
    assert refused.fragment == 1 and refused.reason == "not sent: payload holds non-finite values"
