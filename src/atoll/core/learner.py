"""The learner protocol state machine (sans-I/O).

It owns no model and no socket. A driver tells it: a local step finished (`on_step`), a message
arrived (`on_heal`, `on_update`, `on_pull`, `on_refused`, `on_welcome`), a contribution did not
encode (`on_unsendable`), the syncer's answer to a heartbeat (`budget.answer`, `request_stop`);
it asks what a rejoin says (`rejoin_says`), and at every step boundary what to do (`boundary`:
sends, events, whether to wait and how long, or that its run is over). It applies due global
fragments to the parameters it was given, at step boundaries only. Both drivers
(atoll.sim.decoupled, atoll.live.learner.api) make these calls and decide nothing themselves.

Its lifecycle is `phase` (a `Phase`: joining, running, waiting, done, down; learner_types.py).

Life of fragment p on a learner:
    step s with s mod H == t_p  -> send Contribution(delta = base_p - theta_p, counters)
    answer arrives (an update that includes this send)
    step >= s + tau             -> apply it (receipt mode), reset counters
If the answer has not arrived by step s + tau, `blocked()` names p and the driver waits.
Updates that do not answer a send of ours are kept (latest wins) and applied with the answer.

Memory: one copy of the model besides the parameters. `base[p]` is `latest[p]` (one tensor)
until a newer value arrives: no tensor it holds is ever changed in place (updates, heals and
receipts make new ones). Values live where the fragment store keeps them (`device`): on the
device of their fragment's parameters, or in host memory for an island's sharded fragments.

Encoding is the driver's: a send is an `Outgoing` (the raw delta and its counters); the driver
encodes it with its `codec.ContributionEncoder` in send order. Goodput's books are kept here:
each step's time is split evenly over the P fragments, and a send carries (`work_s`) the
fragment's share since its previous send; `final_flush` sends every fragment with unsent work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from atoll.core import codec, learner_state
from atoll.core.admission import rejoin
from atoll.core.budget import BudgetShare
from atoll.core.counters import FragmentCounters
from atoll.core.events import Applied, Blocked, Event, Healed, HealNeeded, PushRefused
from atoll.core.fragments import FragmentPlan, FragmentStore, TensorFragments
from atoll.core.grace import EMA
from atoll.core.learner_types import (
    Boundary,
    HealRequest,
    LearnerConfig,
    Outstanding,
    Phase,
    supersede,
)
from atoll.core.messages import (
    Action,
    FragmentUpdate,
    Heal,
    LearnerOutput,
    Outgoing,
    Progress,
    Pull,
    Resume,
    Send,
    UpdateKind,
)
from atoll.core.receipt import receive

__all__ = ["Boundary", "HealRequest", "LearnerConfig", "LearnerProtocol", "Phase", "supersede"]


class LearnerProtocol:
    def __init__(
        self,
        learner_id: str,
        plan: FragmentPlan,
        params: Mapping[str, torch.Tensor],
        config: LearnerConfig | None = None,
        flat: FragmentStore | None = None,
        budget: BudgetShare | None = None,
    ) -> None:
        """`flat`: where fragment values are read and written (`FlatFragments`: the parameters
        laid out per fragment, one op each; an island's collective store); None: per-tensor
        copies through the plan. `budget`: its
        side of the run's token budget, which a driver may have fed before the protocol
        existed (the syncer's answers to heartbeats sent before the first heal)."""
        self.id = learner_id
        self.plan = plan
        self.params = params
        self.flat: FragmentStore = flat if flat is not None else TensorFragments(plan, params)
        self.cfg = config or LearnerConfig()
        self.cfg.validate(plan.H)
        self.step = self.seq = 0  # steps taken, contributions sent
        self.counters = FragmentCounters(plan.P)
        self.generation = 0  # heals so far: the driver's encoder starts over at each
        self.step_time = EMA(0.1)
        self.work_s = 0.0  # step-seconds since this learner started
        self.unsent = [0.0] * plan.P  # step-seconds per fragment not yet sent
        self.base: list[torch.Tensor] = []  # global value each fragment's theta is based on
        self.base_version: list[int] = []
        self.latest: list[torch.Tensor] = []  # newest public global value (may be unapplied)
        self.latest_version: list[int] = []
        self.outstanding: dict[int, Outstanding] = {}
        self.pulled: set[int] = set()
        self.phase = Phase.JOINING
        self.wait_since = 0.0  # when the current wait began (WAITING)
        self.budget = budget if budget is not None else BudgetShare()
        # where the driver wants fragment p's delta written (e.g. memory its communication
        # side reads), or None: a new tensor; set by a driver, never by the simulator
        self.delta_out: Callable[[int], torch.Tensor | None] | None = None

    @property
    def healed(self) -> bool:
        """Whether it has loaded the global fragments (it trains only then)."""
        return self.generation > 0

    @property
    def tokens(self) -> int:
        """Tokens trained by this learner (reported in its heartbeats)."""
        return self.counters.total_tokens

    def _on_device(self, p: int, value: torch.Tensor) -> torch.Tensor:
        """`value` where fragment p's values are kept (itself when it is there): the store's
        device (an island keeps a sharded fragment's in host memory)."""
        device = self.flat.device(p)
        return value if value.device == device else value.to(device)

    # -- inputs -----------------------------------------------------------------------------
    def on_heal(self, now: float, heal: Heal) -> list[Event]:
        """Load the global fragments the heal carries (a "held" one is the learner's own
        value), overwrite those local parameters, reset their counters. A heal from a sharded
        syncer carries one shard's fragments: the learner is healed (trains) once every
        fragment has a value, and a later heal of one shard leaves the others' progress as it
        is. Each heal that leaves every fragment loaded is a new generation; a wait in
        progress ends."""
        P = self.plan.P
        if not self.latest:
            self.latest, self.latest_version = [torch.empty(0)] * P, [-1] * P
            self.base, self.base_version = [torch.empty(0)] * P, [-1] * P
        covered = []
        for u in heal.updates:
            p = u.fragment
            if u.kind == UpdateKind.HELD:  # our own value is the global one (digests matched)
                value = self.flat.flatten(p)
            elif u.kind == UpdateKind.FULL:
                value = self._on_device(p, codec.decode(u.payload, self.plan.fragments[p].numel))
            else:
                raise ValueError("a heal carries full or held values only")
            self.latest[p] = self.base[p] = value  # the same tensor (never changed in place)
            self.latest_version[p] = self.base_version[p] = u.version
            covered.append(p)
        if min(self.latest_version) < 0:
            if self.healed:
                raise ValueError("heal is missing fragments")
            for p in covered:
                self.flat.assign(p, self.base[p])
            return []  # other shards' heals are still to come
        events = self._end_wait(now)
        for p in covered:
            self.flat.assign(p, self.base[p])
            self.counters.reset(p)
            self.outstanding.pop(p, None)
            self.pulled.discard(p)
            self.unsent[p] = 0.0  # overwritten by the heal: that work is lost
        self.generation += 1
        if self.phase is not Phase.DONE:
            self.phase = Phase.RUNNING
        return [*events, Event(now, self.id, Healed(versions=list(self.base_version)))]

    def on_step(self, now: float, tokens: int, step_time: float) -> list[Send]:
        """A local step finished; returns the contributions now due (and, when pulled, a
        Progress report)."""
        if not self.healed:
            raise RuntimeError(f"learner {self.id} stepped before healing from the syncer")
        self.step += 1
        self.step_time.update(step_time)
        self.counters.add_step(tokens)
        self.work_s += step_time
        share = step_time / self.plan.P
        unsent = self.unsent
        for p in range(self.plan.P):
            unsent[p] += share
        if self.phase is Phase.DONE:
            return []  # its run is over: only `finish` sends (what was trained since)
        if self.cfg.schedule == "push":
            return self.send_now(now, self.plan.due(self.step))
        progress = Send("syncer", Progress(self.id, self.step, step_time, now, self.work_s))
        return [progress, *self.take_pulled(now)]

    def on_pull(self, now: float, pull: Pull) -> list[Send]:
        """The syncer asks for a fragment; it goes out at the next step boundary, or at once
        when the learner is idle there (waiting for an answer)."""
        if 0 <= pull.fragment < self.plan.P and self.phase is not Phase.DONE:
            self.pulled.add(pull.fragment)
        return self.take_pulled(now) if self.phase is Phase.WAITING else []

    def on_refused(
        self, now: float, fragment: int, reason: str, action: str
    ) -> list[LearnerOutput]:
        """The syncer refused a contribution: an event, and a heal when that is its answer."""
        out: list[LearnerOutput] = [Event(now, self.id, PushRefused(fragment, reason))]
        if action == Action.HEAL:
            out.append(Send("syncer", HealRequest(reason, fragment)))
        return out

    def on_unsendable(self, now: float, fragment: int, reason: str) -> list[LearnerOutput]:
        """Its contribution did not encode (values not finite or beyond the codec's range: a
        diverged model): not sent, and it heals, as if the syncer had refused it."""
        return self.on_refused(now, fragment, f"not sent: {reason}", Action.HEAL)

    def on_welcome(
        self, now: float, restarted: bool, heal: bool, served: Sequence[int] = ()
    ) -> list[Send]:
        """The syncer (a shard of it, serving `served`; empty: all) welcomed it again. One
        that `restarted` lost its open rounds: when it resumes (keeps its progress, no
        `heal`), every fragment of its sent and not yet answered goes again, as if pulled (its
        delta from the same base holds that work, so none of it is lost)."""
        if not restarted or heal or not self.healed or self.phase is Phase.DONE:
            return []
        mine = set(served) if served else set(range(self.plan.P))
        self.pulled |= {p for p, r in self.outstanding.items() if not r.answered and p in mine}
        return self.take_pulled(now) if self.phase is Phase.WAITING else []

    def rejoin_says(self, heal: bool = False, other_epoch: bool = False) -> Resume | None:
        """What a (re)join says of its past (admission.rejoin): nothing before its first heal,
        else its base and newest versions, keeping its progress unless `heal`; `other_epoch`:
        it saw an earlier syncer process (the virtual-time driver knows it)."""
        past = (self.base_version, self.latest_version) if self.healed else None
        return rejoin(past, heal, other_epoch)

    # -- the token budget and the end of the run --------------------------------------------
    def request_stop(self) -> None:
        """The syncer says the run's token budget is spent."""
        self.budget.stop()

    @property
    def should_stop(self) -> bool:
        """The budget is spent: the syncer said so (core/budget.py, `BudgetShare`)."""
        return self.phase is Phase.DONE or self.budget.spent(self.tokens)

    def boundary(self, now: float) -> Boundary:
        """A step boundary (after `on_step`, or while waiting when something arrived or the
        wait is up): apply the answered fragments whose overlap has elapsed, then step on,
        wait for an answer due before the next step, or end the run with the final flush."""
        if self.phase is Phase.DONE:
            return Boundary(done=True)
        events: list[Event] = []
        if self.phase is Phase.WAITING:
            left = self.wait_since + self.cfg.max_wait_s - now
            if self.blocked() and left > 0:
                return Boundary(wait_s=left)
            events += self._end_wait(now)
        events += self.apply_due(now)
        if self.should_stop:
            end = self.finish(now)
            return Boundary(end.sends, events + end.events, 0.0, True)
        if self.cfg.max_wait_s > 0 and self.blocked():
            self.phase, self.wait_since = Phase.WAITING, now
            return Boundary([], events, self.cfg.max_wait_s)
        return Boundary([], events)

    def finish(self, now: float) -> Boundary:
        """The end of this learner's run: stop waiting, send every fragment with unsent work
        once (the final flush). It sends nothing more but what it trains after this."""
        events = self._end_wait(now)
        self.phase = Phase.DONE
        return Boundary(self.final_flush(now), events, 0.0, True)

    def on_down(self, now: float) -> list[Event]:
        """Its process died (the driver's word): a wait in progress ends."""
        events = self._end_wait(now)
        self.phase = Phase.DOWN
        return events

    def _end_wait(self, now: float) -> list[Event]:
        if self.phase is not Phase.WAITING:
            return []
        self.phase = Phase.RUNNING
        return [Event(now, self.id, Blocked(now - self.wait_since))]

    def take_pulled(self, now: float) -> list[Send]:
        """Contributions for every pulled fragment (call at a step boundary: after a step,
        or while waiting between steps)."""
        if not self.healed or not self.pulled:
            return []
        due, self.pulled = sorted(self.pulled), set()
        return self.send_now(now, due)

    def final_flush(self, now: float) -> list[Send]:
        """The end of this learner's run: every fragment with unsent work, once."""
        self.pulled.clear()
        return self.send_now(now, [p for p in range(self.plan.P) if self.unsent[p] > 0])

    def unsent_work(self, p: int | None = None) -> float:
        """Step-seconds not yet sent: of fragment p, or of all fragments (lost if it dies)."""
        return sum(self.unsent) if p is None else self.unsent[p]

    def all_answered(self) -> bool:
        return all(r.answered for r in self.outstanding.values())

    def send_now(self, now: float, fragments: list[int]) -> list[Send]:
        """Contributions for `fragments` now (the schedule's, or a final flush), as `Outgoing`
        deltas for the driver to encode."""
        out = []
        for p in fragments:
            carry = self.cfg.receipt == "carry"  # only then is theta kept past this line
            theta = self.flat.flatten(p, copy=carry)
            buf = self.delta_out(p) if self.delta_out is not None else None
            if buf is None:
                delta = self.base[p] - theta
            elif buf.device == theta.device:
                delta = torch.sub(self.base[p], theta, out=buf)
            else:  # e.g. taken on a GPU, written once to the host memory the driver reads
                delta = buf.copy_(self.base[p] - theta)
            work, self.unsent[p] = self.unsent[p], 0.0
            self.seq += 1
            steps, tokens = self.counters.steps_of(p), self.counters.tokens_of(p)
            kept = theta if carry else None
            self.outstanding[p] = Outstanding(self.seq, self.step, kept, steps, tokens)
            o = Outgoing(learner=self.id, fragment=p, seq=self.seq,
                         base_version=self.base_version[p], steps=steps, tokens=tokens,
                         sent_at=now, step_time=self.step_time.value or 0.0, work_s=work,
                         generation=self.generation, delta=delta)  # fmt: skip
            out.append(Send("syncer", o))
        return out

    def on_update(
        self, now: float, u: FragmentUpdate, value: torch.Tensor | None = None
    ) -> list[LearnerOutput]:
        """A broadcast update arrived. `value`, when given, is `u.payload` already decoded (a
        flat float32 tensor, e.g. decoded by a driver's communication thread); it is then used
        as is (not copied, not changed) instead of decoding the payload here: a full value is
        kept, a delta only read during this call. A delta that does not chain onto what the
        learner has asks for a heal (`HealRequest`)."""
        p = u.fragment
        if not self.healed or u.version <= self.latest_version[p]:
            return []
        if u.kind != UpdateKind.FULL and u.base_version != self.latest_version[p]:
            reason = (
                f"delta update for fragment {p} based on version {u.base_version}, "
                f"learner has {self.latest_version[p]}: it must heal"
            )
            heal = HealRequest(reason, p)
            return [Event(now, self.id, HealNeeded(reason)), Send("syncer", heal)]
        numel = self.plan.fragments[p].numel
        if value is None:
            value = codec.decode(u.payload, numel)
        elif value.dtype != torch.float32 or value.dim() != 1 or value.numel() != numel:
            raise codec.CodecError(
                f"decoded update for fragment {p} is {value.dtype} {tuple(value.shape)}, "
                f"expected float32 ({numel},)"
            )
        value = self._on_device(p, value)
        self.latest[p] = value if u.kind == UpdateKind.FULL else self.latest[p] + value
        self.latest_version[p] = u.version
        rec = self.outstanding.get(p)
        if rec is not None and any(lid == self.id and s >= rec.seq for lid, s in u.included):
            rec.answered = True
        return []

    # -- queries and step-boundary actions ---------------------------------------------------
    def blocked(self) -> list[int]:
        """Fragments whose answer is due before the next step but has not arrived."""
        if not self.cfg.block:
            return []
        return [
            p
            for p, r in self.outstanding.items()
            if not r.answered and self.step >= r.step + self.cfg.tau
        ]

    def apply_due(self, now: float) -> list[Event]:
        """Apply every answered fragment whose tau overlap has elapsed."""
        events = []
        for p, r in list(self.outstanding.items()):
            if not r.answered or self.step < r.step + self.cfg.tau:
                continue
            if self.cfg.receipt == "overwrite":  # the local value is not needed: copy it in
                self.flat.assign(p, self.latest[p])
            else:
                local = self.flat.flatten(p)
                new = receive(self.cfg.receipt, local, self.latest[p], r.at_send, self.cfg.alpha)
                self.flat.assign(p, new)
            self.base[p] = self.latest[p]  # shared until a newer value arrives
            self.base_version[p] = self.latest_version[p]
            if self.cfg.receipt == "carry":
                self.counters.reset(
                    p, self.counters.steps_of(p) - r.steps, self.counters.tokens_of(p) - r.tokens
                )
            else:
                self.counters.reset(p)
            del self.outstanding[p]
            events.append(Event(now, self.id, Applied(p, self.base_version[p], self.cfg.receipt)))
        return events

    # -- durable state ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The protocol's state (copies; the parameters are the model's, not in it): a learner
        process restored with it and its model's weights goes on where it was."""
        return learner_state.state_of(self)

    def load_state_dict(self, st: dict) -> None:
        learner_state.load_into(self, st)
