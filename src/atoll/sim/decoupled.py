"""Decoupled DiLoCo in virtual time.

A queue of timed items (sim/queue.py: a step ends, a message arrives, a syncer timer fires, a
learner fails or recovers, a chaos fault begins: atoll.sim.faults) drives M learner state
machines and one syncer state machine (atoll.core); this module only moves messages over
simulated links, runs the real training steps, injects failures and keeps the books.

Goodput = (learner time spent on steps whose work reached the syncer) / (M * wall time).
Each step's time is split evenly over the P fragments (the learner protocol keeps these books);
a fragment's share becomes useful when the syncer accepts a contribution carrying it, and is
lost if the learner dies first. The run's statistics are computed from the event stream by
atoll.metrics, as a live run's are; it has live learners' `step` reports too (SimLearner.
report). Each learner's encoder (with its error feedback) is this driver's: the protocol hands
out raw deltas, encoded here in send order. What a learner does at a step boundary (step on,
wait for an answer, end its run with the final flush) is its protocol's decision
(`LearnerProtocol.boundary`), as in a live learner.
"""

from __future__ import annotations

import torch

from atoll import metrics
from atoll.config import SimConfig
from atoll.core import codec
from atoll.core.budget import EvalPoints
from atoll.core.codec import ContributionEncoder
from atoll.core.events import Evaluated, Event, Failed, Reconnected, Rejoined, Sent
from atoll.core.fragments import make_plan
from atoll.core.learner import Boundary, HealRequest, LearnerProtocol, Phase
from atoll.core.messages import (
    CONTROL_BYTES,
    Contribution,
    FragmentUpdate,
    Heal,
    LearnerOutput,
    Outgoing,
    Progress,
    Pull,
    PullTick,
    PushAnswer,
    Resumed,
    Send,
    SetTimer,
    SyncerOutput,
)
from atoll.core.syncer import SyncerProtocol
from atoll.model.data import TokenCorpus
from atoll.model.recipe import load_corpus, new_model
from atoll.model.train import DataStream, Evaluator, inner_lr, new_inner_optimizer, train_step
from atoll.sim import queue as q
from atoll.sim.faults import Faults
from atoll.sim.learner import Answered, SimLearner, nbytes_of
from atoll.sim.world import (
    STAT_KEYS,
    FailureSchedule,
    Link,
    ProgressFn,
    RunResult,
    StepClock,
    dp_equivalent_bytes,
    run_end,
)


class DecoupledSim:
    def __init__(
        self,
        cfg: SimConfig,
        name: str = "decoupled",
        progress: ProgressFn | None = None,
        corpus: TokenCorpus | None = None,
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
            end=run_end(cfg),
        )
        bw, lat = cfg.bandwidth_mbps * 1e6, cfg.latency_ms / 1e3
        self.learners: list[SimLearner] = []
        for i in range(cfg.learners):
            model = new_model(cfg)
            self.learners.append(
                SimLearner(
                    id=f"L{i}",
                    index=i,
                    model=model,
                    opt=new_inner_optimizer(model, cfg),
                    proto=self._protocol(f"L{i}", model),
                    data=DataStream(cfg, corpus, i),
                    clock=StepClock(cfg, i),
                    failures=FailureSchedule(cfg, i),
                    up=Link(bw, lat),
                    down=Link(bw, lat),
                    encoder=self._encoder(),
                )
            )
        self.by_id = {learner.id: learner for learner in self.learners}
        self.queue = q.Queue()
        self.push = self.queue.push  # (faults.py pushes too)
        self.events: list[Event] = []
        self.tokens = 0
        self.budget = cfg.budget_tokens()
        self.stopping = False
        self.end_time = 0.0
        self.failures = 0
        self.heal_bytes = 0
        self.curve: list[dict[str, float]] = []
        self.eval_points = EvalPoints(self.budget, cfg.eval_points)
        self.faults = Faults(self)

    def _protocol(self, lid: str, model: torch.nn.Module) -> LearnerProtocol:
        """A fresh learner process's protocol (parameters come from its first heal)."""
        params = dict(model.named_parameters())
        return LearnerProtocol(lid, self.plan, params, self.cfg.learner_config())

    def _encoder(self) -> ContributionEncoder:
        return ContributionEncoder(self.cfg.codec, self.cfg.group, self.cfg.error_feedback)

    # -- plumbing -----------------------------------------------------------------------------
    def syncer_outputs(self, now: float, outputs: list[SyncerOutput]) -> None:
        """The syncer protocol's outputs (a Commit and a PushAnswer need nothing here)."""
        for o in outputs:
            match o:
                case Event():
                    self.events.append(o)
                case SetTimer(at, key):
                    self.push(at, q.Timer(key, self.faults.syncer_epoch))
                case Send(to, message) if self.by_id[to].phase is not Phase.DOWN:
                    learner, nbytes = self.by_id[to], nbytes_of(message)
                    self.heal_bytes += nbytes if isinstance(message, Heal) else 0
                    at, epoch = learner.down.transfer(now, nbytes), self.faults.syncer_epoch
                    self.push(at, q.Down(learner.id, learner.incarnation, message, epoch))

    def _learner_outputs(self, now: float, learner: SimLearner, out: list[LearnerOutput]) -> None:
        """A learner protocol's outputs: events into the stream, sends up its link."""
        for o in out:
            if isinstance(o, Event):
                self.events.append(o)
            else:
                self._send_up(now, learner, o.message)

    def _start_step(self, now: float, learner: SimLearner) -> None:
        dt = learner.clock.draw()
        stalls = learner.stalls
        learner.step_at, learner.step_dt = stalls.advance(now, dt) if stalls else now + dt, dt
        self.push(learner.step_at, q.StepDone(learner.id, learner.incarnation, dt))

    def _boundary(self, now: float, learner: SimLearner, b: Boundary | None = None) -> None:
        """Between two steps: the protocol says (`b`, or now) step again, wait, or stop."""
        b = b if b is not None else learner.proto.boundary(now)
        self._learner_outputs(now, learner, [*b.events, *b.sends])
        if b.done:
            self.end_time = max(self.end_time, now)
            self.events.append(learner.report(now))
        elif b.wait_s == 0:
            self._start_step(now, learner)

    def _send_up(self, now: float, learner: SimLearner, o: object) -> None:
        if isinstance(o, Progress | HealRequest):
            at = learner.up.transfer(now, CONTROL_BYTES)
            self.push(at, q.Up(learner.id, learner.incarnation, o))
            return
        assert isinstance(o, Outgoing) and learner.encoder is not None
        try:
            c = learner.encoder.encode(o)
        except codec.CodecError as exc:  # its own values are broken: its protocol decides
            out = learner.proto.on_unsendable(now, o.fragment, str(exc))
            return self._learner_outputs(now, learner, out)
        if c is None:  # encoded after a heal that made it obsolete: not sent
            return
        learner.inflight[c.seq] = c.work_s
        sent = Sent(c.fragment, c.seq, c.base_version, len(c.payload), c.steps, c.tokens)
        at = learner.up.transfer(now, len(c.payload))
        self.events += [Event(now, learner.id, sent), learner.report(now)]
        self.push(at, q.Up(learner.id, learner.incarnation, c))

    # -- event handlers -----------------------------------------------------------------------
    def _on_step(self, now: float, learner: SimLearner, dt: float) -> None:
        batch = learner.data.next()
        train_step(learner.model, learner.opt, batch, inner_lr(self.cfg, learner.local_steps))
        learner.local_steps += 1
        self.stepped(now, learner, batch[0].numel(), dt)

    def stepped(self, now: float, learner: SimLearner, tokens: int, dt: float) -> None:
        """`learner` finished a step of `tokens` that took `dt`: its protocol's outputs, the
        books, then its step boundary."""
        learner.stepped(tokens)
        self._learner_outputs(now, learner, learner.proto.on_step(now, tokens, dt))
        self.counted(now, tokens, learner)
        self._boundary(now, learner)

    def counted(self, now: float, tokens: int, by: SimLearner) -> None:
        """`by` trained `tokens` more: the run's count, and the syncer's word on the budget
        (core/budget.py: spent, the learners stop)."""
        self.tokens += tokens
        self._maybe_eval(now)
        if self.progress:
            self.progress(min(self.tokens, self.budget), self.budget)
        self.syncer_outputs(now, self.syncer.on_tokens(now, self.tokens))
        if self.syncer.end.spent and not self.stopping:
            self._stop(now, by)

    def _stop(self, now: float, by: SimLearner) -> None:
        """The token budget is spent: the syncer tells every learner (in virtual time, at
        once); one waiting at a step boundary ends its run now, the others at their next."""
        self.stopping = True
        for other in self.learners:
            other.proto.request_stop()
            if other is not by and other.phase is Phase.WAITING:
                self._boundary(now, other, other.proto.finish(now))

    def on_up(self, now: float, learner: SimLearner, c: Contribution | Progress) -> None:
        if self.faults.syncer_down:
            self.faults.hold(learner, c)
            return
        if isinstance(c, Progress):
            self.syncer_outputs(now, self.syncer.on_progress(now, c))
            return
        if isinstance(c, HealRequest):
            self.syncer_outputs(now, self.syncer.on_join(now, learner.id))
            return
        learner.inflight.pop(c.seq, None)
        outputs = self.syncer.on_contribution(now, c)
        self.syncer_outputs(now, outputs)
        for o in outputs:
            if isinstance(o, PushAnswer) and not o.accepted:  # the reply reaches the learner
                at = learner.down.transfer(now, CONTROL_BYTES)
                msg, epoch = Answered(c.fragment, o), self.faults.syncer_epoch
                self.push(at, q.Down(learner.id, learner.incarnation, msg, epoch))

    def receive(self, now: float, learner: SimLearner, msg: object, epoch: int) -> None:
        proto = learner.proto
        if isinstance(msg, Heal):
            if epoch != self.faults.syncer_epoch:
                return  # from a syncer that has since died: the restarted one heals it again
            was = proto.phase
            self.events += proto.on_heal(now, msg)
            if was is Phase.RUNNING:
                return  # a heal it asked for: the step in progress goes on from the new values
            if was is Phase.WAITING:
                self._start_step(now, learner)  # nothing is outstanding any more
                return
            if learner.incarnation > 0:
                self.events.append(Event(now, learner.id, Rejoined(now - learner.down_since)))
            self._schedule_failure(now, learner)
            if self.stopping:
                proto.request_stop()
                self._learner_outputs(now, learner, proto.finish(now).sends)
            else:
                self._start_step(now, learner)
            return
        if isinstance(msg, Pull):
            self._learner_outputs(now, learner, proto.on_pull(now, msg))
            return
        if isinstance(msg, Answered):
            a = msg.answer
            self._learner_outputs(
                now, learner, proto.on_refused(now, msg.fragment, a.reason, a.action)
            )
            return
        if isinstance(msg, Resumed):  # the syncer restarted: it kept our base versions
            if not proto.healed:
                return  # an update of a dead syncer overtook the heal of the new one
            self._learner_outputs(now, learner, proto.on_welcome(now, True, False))
            for u in msg.updates:
                self._learner_outputs(now, learner, proto.on_update(now, u))
            self.events.append(Event(now, learner.id, Reconnected(False, str(epoch))))
        else:
            assert isinstance(msg, FragmentUpdate)
            self._learner_outputs(now, learner, proto.on_update(now, msg))
        if proto.phase is Phase.WAITING:
            self._boundary(now, learner)

    def _schedule_failure(self, now: float, learner: SimLearner) -> None:
        nxt = learner.failures.next()
        if nxt is not None:
            fail_at, back_at = nxt
            fail_at = max(fail_at, now)
            self.push(fail_at, q.Fail(learner.id, learner.incarnation, back_at - nxt[0]))

    def _died(self, now: float, learner: SimLearner) -> None:
        """Its process is gone: whatever it had under way is void, its links start over."""
        self.events += [*learner.proto.on_down(now), learner.report(now)]
        learner.inflight.clear()
        learner.restart()
        learner.up.reset(now)
        learner.down.reset(now)
        self.faults.process_died(now, learner)

    def fail(self, now: float, learner: SimLearner, downtime: float) -> None:
        if learner.phase is Phase.DONE or self.stopping:
            return
        lost = learner.proto.unsent_work() + sum(learner.inflight.values())
        self._died(now, learner)  # (a wait it was in ends before it fails)
        self.failures += 1
        learner.down_since = now
        self.events.append(Event(now, learner.id, Failed(lost)))
        if not self.faults.syncer_down:
            self.syncer_outputs(now, self.syncer.on_lost(now, learner.id))
        self.push(now + downtime, q.Recover(learner.id, learner.incarnation))

    def leave(self, now: float, learner: SimLearner) -> None:
        """Removed for good (chaos `remove`): unsent work is lost, the syncer drops it."""
        was_down = learner.phase is Phase.DOWN
        self._died(now, learner)
        learner.member = "gone"
        if not was_down and not self.faults.syncer_down:
            self.syncer_outputs(now, self.syncer.on_lost(now, learner.id, "removed"))

    def recover(self, now: float, learner: SimLearner) -> None:
        # a fresh process: new inner optimizer and protocol state; parameters come from the heal
        learner.opt = new_inner_optimizer(learner.model, self.cfg)
        learner.proto = self._protocol(learner.id, learner.model)
        learner.encoder = self._encoder()
        if not self.faults.syncer_down:  # else it joins when the syncer is back
            self.syncer_outputs(now, self.syncer.on_join(now, learner.id))

    def _maybe_eval(self, now: float) -> None:
        if due := self.eval_points.due(self.tokens):  # in the stream too, as a live syncer
            loss = self.evaluate(self.syncer.global_params())  # says it (no virtual time)
            self.curve += [dict(tokens=self.tokens, time_s=now, eval_loss=loss) for _ in range(due)]
            done = Evaluated(self.tokens, self.syncer.rounds_closed, loss, 0.0)
            self.events.append(Event(now, "syncer", done))

    # -- main loop ----------------------------------------------------------------------------
    def run(self) -> RunResult:
        for learner in self.learners:
            if learner.member == "in":  # (else added late by the scenario)
                # started from the run's initial weights, as a live learner's Hello shows
                held = {n: codec.digest(p) for n, p in learner.model.named_parameters()}
                self.syncer_outputs(0.0, self.syncer.on_join(0.0, learner.id, digests=held))
        self.faults.schedule()
        while self.queue:
            now, item = self.queue.pop()
            match item:
                case q.Timer(key, epoch):
                    if isinstance(key, PullTick) and all(x.finished for x in self.learners):
                        continue  # the run is over: let the syncer's pull clock stop
                    if epoch == self.faults.syncer_epoch and not self.faults.syncer_down:
                        self.syncer_outputs(now, self.syncer.on_timer(now, key))
                case q.FaultDue() | q.SyncerUp():
                    self.faults.on_item(now, item)
                case _:
                    self._to_learner(now, item)
        return self._result()

    def _to_learner(self, now: float, item: q.ToLearner) -> None:
        learner = self.by_id[item.learner]
        if item.incarnation != learner.incarnation:
            return  # addressed to (or sent by) a process that has since died
        if isinstance(item, q.Up | q.Down) and learner.net:
            if self.faults.deferred(now, learner, item):
                return  # its link is cut: it arrives when the link is back
        match item:
            case q.Recover():
                self.recover(now, learner)
            case q.StepDone(dt=dt):
                if now == learner.step_at:  # else a stall moved this step's end
                    self._on_step(now, learner, dt)
            case q.Up(message=m):
                self.on_up(now, learner, m)
            case q.Down(message=m, epoch=epoch):
                self.receive(now, learner, m, epoch)
            case q.Fail(downtime=downtime):
                self.fail(now, learner, downtime)

    def _result(self) -> RunResult:
        cfg = self.cfg
        final = self.evaluate(self.syncer.global_params())
        if not self.curve or self.curve[-1]["tokens"] != self.tokens:
            self.curve.append({"tokens": self.tokens, "time_s": self.end_time, "eval_loss": final})
        self.curve[-1]["eval_loss"] = final
        self.events += [x.report(self.end_time) for x in self.learners]  # every byte reported
        stats = metrics.run_stats(self.events, cfg.learners, self.end_time)
        return RunResult(
            name=self.name,
            method="decoupled",
            eval_loss=final,
            tokens=self.tokens,
            wall_time_s=self.end_time,
            goodput=stats["goodput"],
            bytes_up=sum(x.up.bytes_sent for x in self.learners),
            bytes_down=sum(x.down.bytes_sent for x in self.learners),
            bytes_heal=self.heal_bytes,
            dp_bytes=dp_equivalent_bytes(cfg, self.tokens, self.plan.nbytes_fp32()),
            curve=self.curve,
            **{k: stats[k] for k in STAT_KEYS},
        )
