"""Decoupled DiLoCo in virtual time.

One heap of timed events drives M learner state machines and one syncer state machine (from
atoll.core); this module only moves messages over simulated links, runs the real training
steps, injects failures and keeps the books. Event kinds:

    step      a learner finished a local step (its math runs here)
    up        a contribution reaches the syncer
    down      a syncer message (update or heal) reaches a learner
    timer     a syncer timer fires (grace window end)
    fail      a learner dies: unsent and in-flight work is lost, links are cut
    recover   a learner restarts, joins, and heals from the syncer's current fragments
    fault     a fault of the run's chaos scenario begins (atoll.sim.faults)
    syncer_up the syncer restarts after a `kill_syncer` fault

Goodput = (learner time spent on steps whose work reached the syncer) / (M * wall time).
Each step's time is split evenly over the P fragments (the learner protocol keeps these books);
a fragment's share becomes useful when the syncer accepts a contribution carrying it, and is
lost if the learner dies first. The run's statistics are computed from the event stream by
atoll.metrics, as a live run's are. Each learner's encoder (with its error feedback) is this
driver's: the protocol hands out raw deltas, encoded here in send order.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import torch

from atoll import metrics
from atoll.config import SimConfig
from atoll.core import codec
from atoll.core.codec import ContributionEncoder
from atoll.core.events import Blocked, Event, Failed, Reconnected, Rejoined, Sent
from atoll.core.fragments import make_plan
from atoll.core.learner import LearnerProtocol
from atoll.core.messages import (
    CONTROL_BYTES,
    Contribution,
    FragmentUpdate,
    Heal,
    Outgoing,
    Progress,
    Pull,
    PullTick,
    Resumed,
    Send,
    SetTimer,
)
from atoll.core.syncer import SyncerProtocol
from atoll.model.data import ByteCorpus
from atoll.model.recipe import load_corpus, new_model
from atoll.model.train import DataStream, Evaluator, inner_lr, new_inner_optimizer, train_step
from atoll.sim.faults import FINISHED, FaultInjection
from atoll.sim.world import (
    EvalPoints,
    FailureSchedule,
    Link,
    ProgressFn,
    RunResult,
    StepClock,
    Windows,
    dp_equivalent_bytes,
)


@dataclass
class _Learner:
    id: str
    index: int
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    proto: LearnerProtocol
    data: DataStream
    clock: StepClock
    failures: FailureSchedule
    up: Link
    down: Link
    state: str = "joining"  # joining | running | waiting | down | done | absent | gone
    incarnation: int = 0
    local_steps: int = 0
    wait_since: float = 0.0
    down_since: float = 0.0
    next_failure: tuple[float, float] | None = None
    encoder: ContributionEncoder | None = None
    inflight: dict[int, float] = field(default_factory=dict)  # seq -> step-seconds
    step_at: float = 0.0  # when the step in progress ends (its own time: step_dt)
    step_dt: float = 0.0
    stalls: Windows | None = None  # chaos: when its process is stopped
    net: Windows | None = None  # chaos: when its link is cut or slowed (= up/down.outages)


def _nbytes(msg: object) -> int:
    if isinstance(msg, Heal):
        return msg.nbytes
    if isinstance(msg, FragmentUpdate):
        return len(msg.payload)
    if isinstance(msg, Resumed):
        return sum(len(u.payload) for u in msg.updates)
    return CONTROL_BYTES


class DecoupledSim(FaultInjection):
    def __init__(
        self,
        cfg: SimConfig,
        name: str = "decoupled",
        progress: ProgressFn | None = None,
        corpus: ByteCorpus | None = None,
    ) -> None:
        self.cfg = cfg.validate()
        self.name = name
        self.progress = progress
        corpus = corpus if corpus is not None else load_corpus(cfg)
        self.evaluate = Evaluator(cfg, corpus)
        torch.set_num_threads(cfg.threads)
        init = new_model(cfg)
        shapes = {n: tuple(p.shape) for n, p in init.named_parameters()}
        self.plan = make_plan(shapes, cfg.P, cfg.H, init.embedding_names(), cfg.packing)
        params = dict(init.named_parameters())
        self.syncer = SyncerProtocol(
            self.plan,
            [self.plan.flatten(params, p) for p in range(self.plan.P)],
            cfg.syncer_config(),
        )
        bw, lat = cfg.bandwidth_mbps * 1e6, cfg.latency_ms / 1e3
        self.learners: list[_Learner] = []
        for i in range(cfg.learners):
            model = new_model(cfg)
            lid = f"L{i}"
            self.learners.append(
                _Learner(
                    id=lid,
                    index=i,
                    model=model,
                    opt=new_inner_optimizer(model, cfg),
                    proto=LearnerProtocol(
                        lid, self.plan, dict(model.named_parameters()), cfg.learner_config()
                    ),
                    data=DataStream(cfg, corpus, i),
                    clock=StepClock(cfg, i),
                    failures=FailureSchedule(cfg, i),
                    up=Link(bw, lat),
                    down=Link(bw, lat),
                    encoder=self._encoder(),
                )
            )
        self.by_id = {lr.id: lr for lr in self.learners}
        self.queue: list = []
        self._seq = itertools.count()
        self.events: list[Event] = []
        self.tokens = 0
        self.budget = cfg.token_budget()
        self.stopping = False
        self.end_time = 0.0
        self.failures = 0
        self.heal_bytes = 0
        self.curve: list[dict[str, float]] = []
        self.eval_points = EvalPoints(self.budget, cfg.eval_points)
        self.init_faults()

    # -- plumbing -----------------------------------------------------------------------------
    def _push(self, t: float, kind: str, *args) -> None:
        heapq.heappush(self.queue, (t, next(self._seq), kind, args))

    def _syncer_outputs(self, now: float, outputs: list) -> None:
        for o in outputs:
            if isinstance(o, Event):
                self.events.append(o)
                self.track_output(o)
            elif isinstance(o, SetTimer):
                self._push(o.at, "timer", o.key, self.syncer_epoch)
            elif isinstance(o, Send):
                lr = self.by_id[o.to]
                if lr.state == "down":
                    continue
                nbytes = _nbytes(o.message)
                if isinstance(o.message, Heal):
                    self.heal_bytes += nbytes
                self.track_output(o)
                at = lr.down.transfer(now, nbytes)
                self._push(at, "down", lr.id, lr.incarnation, o.message, self.syncer_epoch)

    def _start_step(self, now: float, lr: _Learner) -> None:
        lr.state = "running"
        dt = lr.clock.draw()
        lr.step_at, lr.step_dt = lr.stalls.advance(now, dt) if lr.stalls else now + dt, dt
        self._push(lr.step_at, "step", lr.id, lr.incarnation, dt)

    def _boundary(self, now: float, lr: _Learner) -> None:
        """Between two steps: apply due fragments, then step again, wait, or stop."""
        self.events += lr.proto.apply_due(now)
        if self.stopping:
            self._finish(now, lr)
        elif lr.proto.blocked():
            lr.state, lr.wait_since = "waiting", now
        else:
            self._start_step(now, lr)

    def _end_wait(self, now: float, lr: _Learner) -> None:
        """A waiting learner stops waiting (answer arrived, budget spent, or it failed)."""
        if lr.state == "waiting":
            self.events.append(Event(now, lr.id, Blocked(now - lr.wait_since)))

    def _finish(self, now: float, lr: _Learner) -> None:
        """The token budget is spent: send every fragment's remaining work once, then stop."""
        self._end_wait(now, lr)
        lr.state = "done"
        self.end_time = max(self.end_time, now)
        for s in lr.proto.final_flush(now):
            self._send_up(now, lr, s.message)

    def _encoder(self) -> ContributionEncoder:
        return ContributionEncoder(self.cfg.codec, self.cfg.group, self.cfg.error_feedback)

    def _send_up(self, now: float, lr: _Learner, o: Outgoing | Progress) -> None:
        if isinstance(o, Progress):
            self._push(lr.up.transfer(now, CONTROL_BYTES), "up", lr.id, lr.incarnation, o)
            return
        assert lr.encoder is not None
        c = lr.encoder.encode(o)
        if c is None:  # encoded after a heal that made it obsolete: not sent
            return
        lr.inflight[c.seq] = c.work_s
        self.last_sent[(lr.id, c.fragment)] = c.seq
        sent = Sent(c.fragment, c.seq, c.base_version, len(c.payload), c.steps, c.tokens)
        self.events.append(Event(now, lr.id, sent))
        self._push(lr.up.transfer(now, len(c.payload)), "up", lr.id, lr.incarnation, c)

    # -- event handlers -----------------------------------------------------------------------
    def _on_step(self, now: float, lr: _Learner, dt: float) -> None:
        batch = lr.data.next()
        train_step(lr.model, lr.opt, batch, inner_lr(self.cfg, lr.local_steps))
        lr.local_steps += 1
        tokens = batch[0].numel()
        self.tokens += tokens
        for s in lr.proto.on_step(now, tokens, dt):
            self._send_up(now, lr, s.message)
        self._maybe_eval(now)
        if self.progress:
            self.progress(min(self.tokens, self.budget), self.budget)
        if self.tokens >= self.budget and not self.stopping:
            self.stopping = True
            for other in self.learners:
                if other is not lr and other.state == "waiting":
                    self._finish(now, other)
        self._boundary(now, lr)

    def _on_up(self, now: float, lr: _Learner, c: Contribution | Progress) -> None:
        if self.syncer_down:
            self.hold(lr, c)
            return
        if isinstance(c, Progress):
            self._syncer_outputs(now, self.syncer.on_progress(now, c))
            return
        lr.inflight.pop(c.seq, None)
        self._syncer_outputs(now, self.syncer.on_contribution(now, c))

    def _on_down(self, now: float, lr: _Learner, msg: object, epoch: int) -> None:
        if isinstance(msg, Heal) and epoch != self.syncer_epoch:
            return  # from a syncer that has since died: the restarted one heals it again
        if isinstance(msg, FragmentUpdate | Resumed) and not lr.proto.healed:
            return  # an update of a dead syncer overtook the heal of the new one
        if isinstance(msg, Heal):
            self.events += lr.proto.on_heal(now, msg)
            if lr.incarnation > 0:
                self.events.append(Event(now, lr.id, Rejoined(now - lr.down_since)))
            self._schedule_failure(now, lr)
            if self.stopping:
                lr.state = "done"
            else:
                self._start_step(now, lr)
            return
        if isinstance(msg, Pull):
            lr.proto.on_pull(now, msg)
            if lr.state == "waiting":  # idle at a step boundary: answer the pull at once
                for s in lr.proto.take_pulled(now):
                    self._send_up(now, lr, s.message)
            return
        if isinstance(msg, Resumed):  # the syncer restarted: it kept our base versions
            for u in msg.updates:
                self.events += lr.proto.on_update(now, u)
            self.events.append(Event(now, lr.id, Reconnected(False, str(epoch))))
        else:
            assert isinstance(msg, FragmentUpdate)
            self.events += lr.proto.on_update(now, msg)
        if lr.state == "waiting" and not lr.proto.blocked():
            self._end_wait(now, lr)
            self._boundary(now, lr)

    def _schedule_failure(self, now: float, lr: _Learner) -> None:
        nxt = lr.failures.next()
        if nxt is not None:
            fail_at, back_at = nxt
            fail_at = max(fail_at, now)
            self._push(fail_at, "fail", lr.id, lr.incarnation, back_at - nxt[0])

    def _on_fail(self, now: float, lr: _Learner, downtime: float) -> None:
        if lr.state == "done" or self.stopping:
            return
        self._end_wait(now, lr)
        lost = lr.proto.unsent_work() + sum(lr.inflight.values())
        self.failures += 1
        lr.inflight.clear()
        lr.state, lr.down_since = "down", now
        lr.incarnation += 1
        lr.up.reset(now)
        lr.down.reset(now)
        self.events.append(Event(now, lr.id, Failed(lost)))
        self.process_died(now, lr)
        if not self.syncer_down:
            self._syncer_outputs(now, self.syncer.on_lost(now, lr.id))
        self._push(now + downtime, "recover", lr.id, lr.incarnation)

    def _on_recover(self, now: float, lr: _Learner) -> None:
        # a fresh process: new inner optimizer and protocol state; parameters come from the heal
        lr.opt = new_inner_optimizer(lr.model, self.cfg)
        lr.proto = LearnerProtocol(
            lr.id, self.plan, dict(lr.model.named_parameters()), self.cfg.learner_config()
        )
        lr.encoder = self._encoder()
        lr.state = "joining"
        if not self.syncer_down:  # else it joins when the syncer is back
            self._syncer_outputs(now, self.syncer.on_join(now, lr.id))

    def _maybe_eval(self, now: float) -> None:
        due = self.eval_points.due(self.tokens)
        if due:
            loss = self.evaluate(self.syncer.global_params())
            self.curve += [
                {"tokens": self.tokens, "time_s": now, "eval_loss": loss} for _ in range(due)
            ]

    # -- main loop ----------------------------------------------------------------------------
    def run(self) -> RunResult:
        for lr in self.learners:
            if lr.state != "absent":  # (added late by the scenario)
                # started from the run's initial weights, as a live learner's Hello shows
                held = {n: codec.digest(p) for n, p in lr.model.named_parameters()}
                self._syncer_outputs(0.0, self.syncer.on_join(0.0, lr.id, digests=held))
        self.schedule_faults()
        while self.queue:
            now, _, kind, args = heapq.heappop(self.queue)
            if kind == "timer":
                if isinstance(args[0], PullTick) and all(
                    lr.state in FINISHED for lr in self.learners
                ):
                    continue  # the run is over: let the syncer's pull clock stop
                if args[1] == self.syncer_epoch and not self.syncer_down:
                    self._syncer_outputs(now, self.syncer.on_timer(now, args[0]))
                continue
            if kind in ("fault", "syncer_up"):
                self.on_fault_event(now, kind, args)
                continue
            lr = self.by_id[args[0]]
            if kind == "recover":
                if args[1] == lr.incarnation:
                    self._on_recover(now, lr)
                continue
            if args[1] != lr.incarnation:
                continue  # addressed to (or sent by) a process that has since died
            if kind in ("up", "down") and lr.net and self.deferred(now, lr, kind, args):
                continue  # its link is cut: it arrives when the link is back
            if kind == "step":
                if now == lr.step_at:  # else a stall moved this step's end
                    self._on_step(now, lr, args[2])
            elif kind == "up":
                self._on_up(now, lr, args[2])
            elif kind == "down":
                self._on_down(now, lr, args[2], args[3])
            elif kind == "fail":
                self._on_fail(now, lr, args[2])
        return self._result()

    def _result(self) -> RunResult:
        cfg = self.cfg
        final = self.evaluate(self.syncer.global_params())
        if not self.curve or self.curve[-1]["tokens"] != self.tokens:
            self.curve.append({"tokens": self.tokens, "time_s": self.end_time, "eval_loss": final})
        self.curve[-1]["eval_loss"] = final
        stats = metrics.run_stats(self.events, cfg.learners, self.end_time)
        return RunResult(
            name=self.name,
            method="decoupled",
            eval_loss=final,
            tokens=self.tokens,
            wall_time_s=self.end_time,
            goodput=stats["goodput"],
            bytes_up=sum(lr.up.bytes_sent for lr in self.learners),
            bytes_down=sum(lr.down.bytes_sent for lr in self.learners),
            bytes_heal=self.heal_bytes,
            dp_bytes=dp_equivalent_bytes(cfg, self.tokens, self.plan.nbytes_fp32()),
            rounds=stats["rounds"],
            participants_mean=stats["participants_mean"],
            participants_hist=stats["participants_hist"],
            staleness_mean=stats["staleness_mean"],
            staleness_max=stats["staleness_max"],
            blocked_s=stats["blocked_s"],
            down_s=stats["down_s"],
            lost_work_s=stats["lost_work_s"],
            failures=stats["failures"],
            curve=self.curve,
        )
