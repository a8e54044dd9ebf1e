"""The syncer protocol state machine (sans-I/O).

It holds the global value Theta_p and outer-optimizer state of every fragment. Inputs:
`on_join` (a learner (re)connects: it heals, or resumes with its progress), `on_listening`
(its pull channel opened or closed), `on_lost`, `on_contribution`, `on_progress`,
`on_tokens` (the run's counted tokens), `on_timer`, `close_all` (end of run). `run_over`:
whether a run with a token budget is over (core/budget.py, `RunEnd`; its `RunOver` event says
when). Outputs: `Send` (to a learner), `SetTimer`, `Event`s
for the stream, and records a driver acts on: `Commit` (a merge to make durable before its
updates go out) and `PushAnswer` (the reply to a contribution). Durable state:
`state_dict()` / `load_state_dict()` (atoll.core.state).

Pacing (`schedule`): with "pull" (default) the syncer keeps a tick clock at the measured step
time (EMA of the learners' Progress reports); at tick g it sends Pull for every fragment with
offset g mod H to every learner that can hear it, so each fragment is synchronised once per H
ticks and all learners contribute to the same round whatever their speed. With "push" the
learners send on their own step count.

Closing a round for fragment p:
 1. contributions are kept per learner (a newer one from the same learner replaces the older);
 2. with the pull schedule the round closes at the pull's answer window (pacing.py: the
    slowest listening learner's step time plus the upload time), or at once when every
    listening learner has answered, and never below `quorum` (`grace=False`: at the quorum,
    as with push without grace); with push, once `quorum`
    learners have contributed, the round stays open for the grace window (grace.py), or
    closes at once if every live learner has contributed;
 3. each learner's outer gradient is taken against the current value:
        theta_m = Theta_pub[base_version] - delta_m ;  Delta_m = Theta_p - theta_m
 4. weights tokens^2/steps, merge (RDA, embeddings: weighted mean; a light round's delta
    scaled by its weight against the fragment's usual round, merge.py), outer step, version + 1;
 5. the new value is sent to every live learner: in full (fp32), or as the change of the
    public value quantized with `down_codec` (default int4); the syncer keeps the exact Theta
    and the learners' public copy separately, so what is not sent is carried into the next broadcast
    (error feedback held on the syncer) and the global parameters are never degraded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from atoll.core import fused, intake
from atoll.core.admission import HealCache, SeenVersions, can_resume
from atoll.core.budget import BeatAnswer, RunEnd, TokenBudget
from atoll.core.checks import Pending, check_contribution, decode_checked
from atoll.core.closing import RoundClosing
from atoll.core.counters import token_weight
from atoll.core.delivery import Delivery
from atoll.core.events import (
    Accepted,
    Event,
    Joined,
    LinkBottleneck,
    Lost,
)
from atoll.core.fragments import FragmentPlan
from atoll.core.grace import GracePolicy
from atoll.core.guard import MagnitudeGuard
from atoll.core.merge import RoundWeight
from atoll.core.messages import (
    CloseRound,
    Contribution,
    FragmentUpdate,
    Heal,
    Progress,
    Pull,
    PullTick,
    PushAnswer,
    Refusal,
    Rejection,
    Resume,
    Resumed,
    RunDeadline,
    Send,
    SetTimer,
    SyncerOutput,
    TimerKey,
)
from atoll.core.outer import OuterOptimizer
from atoll.core.pacing import PullRounds
from atoll.core.round_values import kernels_for
from atoll.core.state import Averages, GlobalState, StateView
from atoll.core.syncer_config import SyncerConfig

PROGRESS_STEPS_MAX = 32  # step reports taken from one Progress message that covers many steps


class SyncerProtocol(RoundClosing, StateView):
    def __init__(
        self,
        plan: FragmentPlan,
        init: list[torch.Tensor],
        config: SyncerConfig | None = None,
        owned: frozenset[int] | None = None,
        end: RunEnd | None = None,
    ) -> None:
        """`owned`: the fragments this syncer serves, when it is one shard of several
        (core/shards.py; default: all). It holds nothing of the others and refuses them.
        `end`: the run's token budget and when it is over (default: no budget)."""
        self.plan = plan
        self.cfg = cfg = config or SyncerConfig()
        cfg.validate()
        fused.configure(cfg.fused, cfg.syncer_threads)  # the round's data path, this process's
        # its kernels loaded now when a fragment will take them (a first load in a round would
        # hold the round's caller for a second, or for the compile on a fresh install)
        fused.kernels(max((f.numel for f in plan.fragments), default=0))
        if len(init) != plan.P:
            raise ValueError(f"need {plan.P} initial fragment values, got {len(init)}")
        self.owned = frozenset(range(plan.P)) if owned is None else frozenset(owned)
        self.served = sorted(self.owned)  # in order: the loops over fragments
        init = [v if p in self.owned else torch.empty(0) for p, v in enumerate(init)]
        self.outer = OuterOptimizer(cfg.outer, cfg.outer_lr, cfg.outer_momentum, cfg.outer_delay)
        self.grace = GracePolicy(cfg.quorum, cfg.tau, cfg.grace_gamma, cfg.grace_ema, cfg.grace)
        self.guard = MagnitudeGuard(plan.P, cfg.guard)
        self.round_weight = RoundWeight(plan.P, cfg.light_rounds)
        # the durable state (core/state.py) and what is derived from it
        avg = Averages(self.grace, self.round_weight)
        self.state = GlobalState(
            plan, init, cfg.history, avg, cfg.history_full_every, cfg.history_bytes
        )
        self.heals = HealCache(plan, cfg.heal_codec, cfg.group, self.served)  # encoded once
        self.delivery = Delivery(plan, self.state, cfg.down_codec, cfg.heal_codec, cfg.group)
        self.seen = SeenVersions(plan.P, self.served)  # restored, and seen by earlier epochs
        self.live: set[str] = set()
        self.listening: set[str] = set()  # live learners whose pulls can reach them
        self.pending: list[dict[str, Pending]] = [{} for _ in range(plan.P)]
        self.quorum_at: list[float | None] = [None] * plan.P
        self.round_id = [0] * plan.P
        self.tick = -1  # pull clock: -1 until the first step time is measured
        self.pulled = PullRounds(plan.P)  # when each pulled round closes (core/pacing.py)
        # pulled rounds wait for the answer window; without grace they close at the quorum
        self._answer_window = self.cfg.schedule == "pull" and self.cfg.grace
        # decode buffers of closed rounds, for the next contributions of any fragment: at most
        # one per live learner in all (per fragment they would hold M * 4N bytes)
        self._spare: list[torch.Tensor] = []
        self.end = end or RunEnd(TokenBudget(0))

    # -- the durable state (atoll.core.state: StateView) ----------------------------------------
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state)
        self.loaded()

    def loaded(self) -> None:
        """After a restore: timers of the earlier process never fire, and the versions now
        held are what learners of an earlier epoch are checked against."""
        self.round_id = [r + 1 for r in self.round_id]
        self.seen.restored = list(self.version)

    # -- delivery (atoll.core.delivery) ---------------------------------------------------------
    def coalesce(
        self, queued: tuple[FragmentUpdate, ...], new: FragmentUpdate
    ) -> tuple[FragmentUpdate, ...]:
        return self.delivery.coalesce(queued, new)

    def global_params(self) -> dict[str, torch.Tensor]:
        return self.delivery.global_params()

    def heal_message(self, digests: Mapping[str, bytes] | None = None) -> Heal:
        return self.heals.heal(self.version, self.public, digests)

    def prepare_heal(self, digests: Mapping[str, bytes] | None = None) -> None:
        """Encode (and digest) now what a fresh learner's heal needs, so that `on_join` only
        looks it up: a driver calls it before taking the lock it calls `on_join` under (at
        100M parameters the encode and digests take a second or more, and joins come in
        storms). It changes no state, only the heal caches, which are keyed by the public
        tensors' identity: a merge replaces a tensor and never writes into it, so what is read
        is one whole version, and one replaced meanwhile is encoded again under the lock."""
        self.heals.heal(list(self.version), list(self.public), digests)

    # -- membership --------------------------------------------------------------------------
    def on_join(
        self,
        now: float,
        learner: str,
        resume: Resume | None = None,
        incarnation: str | None = None,
        listening: bool = True,
        digests: Mapping[str, bytes] | None = None,
    ) -> list[SyncerOutput]:
        """Admit `learner`: it heals (every fragment in full, but those whose parameters'
        `digests` show it holds them already), or, asking to `resume` with base versions
        still held, keeps its progress and gets the fragments it lacks.
        `listening=False`: its pull channel opens later (`on_listening`)."""
        out: list[SyncerOutput] = [] if resume is None else self.seen.check(now, learner, resume)
        heal = not can_resume(resume, self.history, self.served)
        self.live.add(learner)
        self.pulled.rejoined(learner)
        if listening:
            self.listening.add(learner)
        else:
            self.listening.discard(learner)
        if heal:
            msg: Heal | Resumed = self.heal_message(digests)
        else:
            assert resume is not None
            msg = self.heals.resumed(self.version, self.public, resume.latest_versions)
        joined = Joined(learner) if incarnation is None else Joined(learner, incarnation, heal)
        return [Send(learner, msg), *out, Event(now, "syncer", joined)]

    def on_listening(self, now: float, learner: str, listening: bool) -> list[SyncerOutput]:
        if listening and learner in self.live:
            self.listening.add(learner)
        else:
            self.listening.discard(learner)
            self.pulled.forget(learner)
        return []

    def on_lost(self, now: float, learner: str, why: str | None = None) -> list[SyncerOutput]:
        self.live.discard(learner)
        self.listening.discard(learner)
        self.pulled.forget(learner)
        self.end.session_ended()
        out: list[SyncerOutput] = [Event(now, "syncer", Lost(learner, why))]
        for p in self.served:
            out += self._maybe_close(now, p)
        return out + self.end.check(now, self.live)

    # -- the end of a run with a token budget (core/budget.py) --------------------------------
    def on_tokens(self, now: float, total: int) -> list[SyncerOutput]:
        """The run has counted `total` tokens: when that spends the budget, the window after it
        starts (a `RunDeadline` timer), and the run is over at once if no learner is left."""
        window = self.pulled.window(self.grace, self.listening)
        return self.end.on_tokens(now, total, window, self.live)

    def on_beat(
        self, now: float, total: int, sessions: int
    ) -> tuple[BeatAnswer, list[SyncerOutput]]:
        """A heartbeat counted: the run has `total` tokens by a driver's books, `sessions`
        learners have a session. The budget's answer to the beat (core/budget.py: what is left,
        or stop) and what the count sets off (`on_tokens`)."""
        out = self.on_tokens(now, total)
        return self.end.budget.answer(total, sessions), out

    def run_over(self, now: float) -> bool:
        """Whether the run is over: the budget spent, and every learner left since or the
        window after the budget passed (`RunEnd.over`)."""
        return self.end.over(now, len(self.live))

    # -- rounds ------------------------------------------------------------------------------
    def prepare(self, c: Contribution) -> Contribution:
        """c with its frame checked and unpacked (`intake.unpack`: crc, decompression, the
        measure of a held body): the part of `on_contribution` that reads no state, for a
        driver to run on its receiving thread before it takes the lock (then it is not done
        again, and the same refusals come in the same order)."""
        p = c.fragment
        if not 0 <= p < self.plan.P or p not in self.owned or c.unpacked is not None:
            return c
        unpacked = intake.unpack(c.payload, self.plan.fragments[p].numel, kernels_for(self, p))
        return dataclasses.replace(c, unpacked=unpacked)

    def on_contribution(self, now: float, c: Contribution) -> list[SyncerOutput]:
        p = c.fragment
        bad = check_contribution(
            c, self.plan, self.live, self.history.held(p), self.state.version_of(p), self.cfg.codec
        ) or self._elsewhere(p)
        spare = self._spare.pop() if not bad and self._spare else None
        got = bad or decode_checked(  # (only once the header passed)
            c,
            self.plan.fragments[p].numel,
            self.history[p][c.base_version],
            self.guard,
            spare,
            kernels_for(self, p),
        )
        if isinstance(got, Rejection):
            if spare is not None:
                self._spare.append(spare)
            return [Event(now, "syncer", got.refused(c.learner, c.fragment)), got.answer()]
        self.guard.accept(p, got.rate, c.steps)
        if c.step_time > 0:
            self.grace.observe_step(c.step_time)
        weight = token_weight(c.tokens, c.steps) if self.cfg.weighting == "tokens" else 1.0
        self.pending[p][c.learner] = Pending(
            got.theta, weight, c, self.version[p] - c.base_version, len(c.payload), now
        )
        accepted = Accepted(c.learner, p, c.seq, len(c.payload), c.work_s)
        out: list[SyncerOutput] = [Event(now, "syncer", accepted), PushAnswer(True)]
        slow = self.pulled.upload(c.learner, max(now - c.sent_at, 0.0), self.grace)
        if slow is not None:
            out.append(Event(now, "syncer", LinkBottleneck(c.learner, *slow)))
        return out + self._maybe_close(now, p)

    def _elsewhere(self, p: int) -> Rejection | None:
        """A fragment another shard serves: refused (the learner sent it to the wrong one)."""
        if p in self.owned:
            return None
        why = f"fragment {p} is not served by this shard (it serves {self.served[:8]}...)"
        return Rejection(Refusal.HEADER, why)

    def on_progress(self, now: float, msg: Progress) -> list[SyncerOutput]:
        """A learner's step report (`msg.step` steps since it joined, `msg.work_s` their
        seconds): measures the step time (once per step it covers, at most
        PROGRESS_STEPS_MAX); starts the pull clock. With the pull schedule only from learners
        that can hear pulls: the clock must not tick for one that cannot."""
        lid = msg.learner
        if lid not in self.live or (self.cfg.schedule == "pull" and lid not in self.listening):
            return []
        measured = self.pulled.measure(msg)
        if measured is None:
            return []
        mean, k = measured
        for _ in range(min(k, PROGRESS_STEPS_MAX)):
            self.grace.observe_step(mean)
        self.pulled.observe(lid, mean)
        if self.cfg.schedule == "pull" and self.tick < 0:
            self.tick = 0
            return [SetTimer(now, PullTick(0))]
        return []

    def _pull(self, now: float, tick: int) -> list[SyncerOutput]:
        out: list[SyncerOutput] = []
        for f in self.plan.fragments:
            if f.offset == tick % self.plan.H and f.index in self.owned:
                out += [Send(lid, Pull(f.index, tick, now)) for lid in sorted(self.listening)]
                if self._answer_window:
                    at = self.pulled.open(f.index, now, self.grace, self.listening)
                    out += [SetTimer(at, CloseRound(f.index, self.round_id[f.index]))]
        self.tick = tick + 1
        return out + [SetTimer(now + (self.grace.step.value or 1.0), PullTick(tick + 1))]

    def on_timer(self, now: float, key: TimerKey) -> list[SyncerOutput]:
        match key:
            case PullTick(tick):
                return self._pull(now, tick)
            case RunDeadline():
                return self.end.check(now, self.live)
            case CloseRound(p, rid) if rid == self.round_id[p]:
                if not self.pending[p]:
                    return []  # nothing answered in time: the first answer closes the round
                return self._maybe_close(now, p) if self._answer_window else self._close(now, p)
        return []
