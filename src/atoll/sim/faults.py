"""A chaos scenario (atoll.chaos) in the virtual-time driver: the fault handlers of DecoupledSim.

The run's timeline (`scenario` setting; random faults drawn from `seed`, horizon from
atoll.sim.world.horizon_s) is pushed onto the event heap as "fault" events; each is applied at
its virtual time, or skipped when it cannot reach its target (a kill or stall of a learner that
is down, not yet added, removed or done; any fault once the token budget is spent). An applied
fault emits the launcher's `chaos` event (action = the fault's kind), as a live run does.

    kill         as a Poisson failure (`fail`): unsent and in-flight work is lost (`failed`),
                 the syncer drops it; back `duration` later it heals and rejoins (`rejoined`).
                 A kill ends a stall in progress (the new process is not stopped)
    stall        the learner's steps stop for `duration` (a step in progress ends that much
                 later) and its link carries nothing either way (messages wait); no heal
    cut          its link carries nothing either way for `duration`: transfers queued or begun
                 then resume, and messages due then arrive, when it is back
    slow         its link's bandwidth is divided by `factor` for `duration` (both directions)
    add          the learner joins at `at` (heals from the current global model) and trains
    remove       the learner leaves for good: unsent work is lost, the syncer drops it (`lost`,
                 why "removed"), it sends nothing more
    kill_syncer  the syncer's durable state (every committed merge: its snapshot + tape) is
                 kept; open rounds, timers and the pull clock die with it. While it is down,
                 contributions that reach it wait at their learners (the live uplink retries)
                 and are taken when it is back, step reports are dropped, learners train on.
                 Back after `duration`: a fresh SyncerProtocol loads that state (`restored`),
                 every running learner resumes (keeps its progress, gets the fragments it
                 lacks: `Resumed`, `reconnected`), joining ones heal; a learner whose
                 contribution died unmerged in an open round sends that fragment again
                 (its delta from the same base holds that work: none of it is lost)
The existing Poisson failures (`mtbf_s`) run beside the scenario, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from atoll.chaos import Fault
from atoll.config import SimConfig
from atoll.core.events import Accepted, Chaos, Event, Restored
from atoll.core.fragments import FragmentPlan
from atoll.core.messages import Contribution, FragmentUpdate, Progress, Resume, Send
from atoll.core.syncer import SyncerProtocol
from atoll.sim.world import Windows, horizon_s, scenario_of

if TYPE_CHECKING:
    from atoll.sim.decoupled import _Learner

FINISHED = ("done", "absent", "gone")  # learners the run no longer waits for
_NOT_RUNNING = ("down", "absent", "gone", "done")  # a kill or stall cannot reach these


class FaultInjection:
    """Mixed into DecoupledSim (which provides the heap, the learners and the syncer)."""

    # provided by DecoupledSim: state, and the plumbing the handlers use
    cfg: SimConfig
    plan: FragmentPlan
    learners: list[_Learner]
    by_id: dict[str, _Learner]
    events: list[Event]
    syncer: SyncerProtocol
    stopping: bool
    _push: Callable[..., None]
    _syncer_outputs: Callable[[float, list], None]
    _send_up: Callable[..., None]
    _on_up: Callable[..., None]
    _on_fail: Callable[[float, _Learner, float], None]
    _end_wait: Callable[[float, _Learner], None]

    def init_faults(self) -> None:
        sc = scenario_of(self.cfg)
        self.syncer_down = False
        self.syncer_epoch = 0  # syncer processes so far - 1: timers and heals of dead ones drop
        self.last_sent: dict[tuple[str, int], int] = {}  # (learner, fragment) -> seq
        self.fault_timeline: list[Fault] = []
        self.applied: list[Fault] = []
        self.skipped = 0
        self._track = False
        if sc is None:
            return
        cfg = self.cfg
        self.fault_timeline = sc.timeline(cfg.learners, horizon_s(cfg, sc), cfg.seed)
        self._track = "kill_syncer" in sc.kinds()
        self._unmerged: dict[tuple[str, int], tuple[int, int]] = {}  # -> (seq, incarnation)
        self._lost: dict[tuple[str, int], tuple[int, int]] = {}
        self._held: list[tuple[str, int, Contribution]] = []
        self._state: dict[str, Any] = {}
        late = sc.late_learners()
        for lr in self.learners:
            lr.stalls, lr.net = Windows(), Windows()
            lr.up.outages = lr.down.outages = lr.net
            if lr.id in late:
                lr.state = "absent"

    def schedule_faults(self) -> None:
        for i, f in enumerate(self.fault_timeline):
            self._push(f.at, "fault", i)

    def chaos_summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for f in self.applied:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        return {
            "scenario": self.cfg.scenario,
            "faults": len(self.fault_timeline),
            "applied": kinds,
            "skipped": self.skipped,
        }

    # -- hooks the driver calls -----------------------------------------------------------
    def track_output(self, o: object) -> None:
        """Syncer outputs: which contributions are accepted and not yet merged (they die
        with the syncer's open rounds)."""
        if not self._track:
            return
        if isinstance(o, Event) and isinstance(o.data, Accepted):
            d = o.data
            self._unmerged[(d.learner, d.fragment)] = (d.seq, self.by_id[d.learner].incarnation)
        elif isinstance(o, Send) and isinstance(o.message, FragmentUpdate):
            u = o.message
            for lid, seq in u.included:
                got = self._unmerged.get((lid, u.fragment))
                if got is not None and got[0] <= seq:
                    del self._unmerged[(lid, u.fragment)]

    def hold(self, lr: _Learner, c: Contribution | Progress) -> None:
        """Reached the syncer while it is down: a contribution waits for its return."""
        if isinstance(c, Contribution):
            self._held.append((lr.id, lr.incarnation, c))

    def deferred(self, now: float, lr: _Learner, kind: str, args: tuple) -> bool:
        """A message due while its link is cut arrives when the link is back."""
        at = (lr.up if kind == "up" else lr.down).open_at(now)
        if at > now:
            self._push(at, kind, *args)
            return True
        return False

    def process_died(self, now: float, lr: _Learner) -> None:
        """A killed learner's restarted process is not stopped: its stall ends."""
        if lr.stalls is not None and lr.net is not None:
            lr.stalls.end_early(now, "stall")
            lr.net.end_early(now, "stall")

    def on_fault_event(self, now: float, kind: str, args: tuple) -> None:
        if kind == "syncer_up":
            self._restart_syncer(now)
            return
        f = self.fault_timeline[args[0]]
        if self.stopping or not self._reaches(f):
            self.skipped += 1
            return
        self.applied.append(f)
        self.events.append(Event(now, "launcher", Chaos(f.kind, f.target, f.duration)))
        self._apply(now, f)

    # -- the faults ---------------------------------------------------------------------
    def _reaches(self, f: Fault) -> bool:
        """Whether `f` can be applied now (module docstring)."""
        if f.kind == "kill_syncer":
            return not self.syncer_down
        state = self.by_id[f.target].state
        if f.kind in ("kill", "stall"):
            return state not in _NOT_RUNNING
        if f.kind == "add":
            return state == "absent"
        return state not in FINISHED if f.kind == "remove" else state != "gone"

    def _apply(self, now: float, f: Fault) -> None:
        if f.kind == "kill_syncer":
            self._kill_syncer(now, f.duration)
            return
        lr = self.by_id[f.target]
        assert lr.stalls is not None and lr.net is not None
        if f.kind == "kill":
            self._on_fail(now, lr, f.duration)
        elif f.kind == "stall":
            self._stall(now, lr, f.end)
        elif f.kind in ("cut", "slow"):
            lr.net.add(now, f.end, 0.0 if f.kind == "cut" else 1.0 / f.factor, f.kind)
        elif f.kind == "add":
            lr.state = "joining"
            if not self.syncer_down:  # else it joins when the syncer is back
                self._syncer_outputs(now, self.syncer.on_join(now, lr.id))
        elif f.kind == "remove":
            self._remove(now, lr)

    def _stall(self, now: float, lr: _Learner, end: float) -> None:
        assert lr.stalls is not None and lr.net is not None
        lr.stalls.add(now, end, 0.0, "stall")
        lr.net.add(now, end, 0.0, "stall")
        if lr.state == "running" and lr.step_at > now:  # the step in progress ends later
            lr.step_at = lr.stalls.advance(now, lr.step_at - now)
            self._push(lr.step_at, "step", lr.id, lr.incarnation, lr.step_dt)

    def _remove(self, now: float, lr: _Learner) -> None:
        was = lr.state
        self._end_wait(now, lr)
        lr.inflight.clear()
        lr.state = "gone"
        lr.incarnation += 1  # whatever it had under way is void
        lr.up.reset(now)
        lr.down.reset(now)
        self.process_died(now, lr)
        if was != "down" and not self.syncer_down:
            self._syncer_outputs(now, self.syncer.on_lost(now, lr.id, "removed"))

    def _kill_syncer(self, now: float, duration: float) -> None:
        self._state = self.syncer.state_dict()  # what its snapshot and tape hold
        self._lost = {**self._lost, **self._unmerged}
        self._unmerged = {}
        self.syncer_down = True
        self.syncer_epoch += 1
        self._push(now + duration, "syncer_up")

    def _restart_syncer(self, now: float) -> None:
        plan = self.plan
        init = [torch.zeros(f.numel) for f in plan.fragments]
        syncer = SyncerProtocol(plan, init, self.cfg.syncer_config())
        syncer.load_state_dict(self._state)
        self.syncer, self.syncer_down = syncer, False
        versions = [st["version"] for st in self._state["fragments"]]
        restored = Restored(0, 0, self._state["rounds_closed"], versions, 0)
        self.events.append(Event(now, "syncer", restored))
        out = self._syncer_outputs
        for lr in self.learners:
            if lr.state in ("running", "waiting", "done"):
                p = lr.proto
                resume = Resume(tuple(p.base_version), tuple(p.latest_version), other_epoch=True)
                out(now, syncer.on_join(now, lr.id, resume))
            elif lr.state == "joining":
                out(now, syncer.on_join(now, lr.id))
        held, self._held = self._held, []
        for lid, incarnation, c in held:
            lr = self.by_id[lid]
            if incarnation == lr.incarnation:
                self._on_up(now, lr, c)
        lost, self._lost = self._lost, {}
        for (lid, frag), (seq, incarnation) in sorted(lost.items()):
            lr = self.by_id[lid]
            if incarnation != lr.incarnation or lr.state not in ("running", "waiting"):
                continue
            if self.last_sent.get((lid, frag)) == seq:  # no newer send of it since
                for s in lr.proto.send_now(now, [frag]):
                    self._send_up(now, lr, s.message)
