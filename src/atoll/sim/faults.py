"""A chaos scenario (atoll.chaos) in the virtual-time driver: a component DecoupledSim calls
(`Faults`), acting on the driver through its public calls only (`SimWorld`).

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
                 lacks: `Resumed`, `reconnected`), joining ones heal; each resumed learner
                 sends again every fragment whose send is still unanswered (the learner
                 protocol's rule, `LearnerProtocol.on_welcome`: a contribution that died in
                 an open round is merged from the same base, none of its work is lost)
The existing Poisson failures (`mtbf_s`) run beside the scenario, unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

from atoll.chaos import Fault
from atoll.config import SimConfig
from atoll.core.events import Chaos, Event, Restored
from atoll.core.learner import Phase
from atoll.core.messages import Contribution, Progress, SyncerOutput
from atoll.core.syncer import SyncerProtocol
from atoll.sim import queue as q
from atoll.sim.world import Windows, horizon_s, run_end, scenario_of

if TYPE_CHECKING:
    from atoll.sim.learner import SimLearner


class SimWorld(Protocol):
    """What the fault injection may do to the driver: its public calls and state."""

    cfg: SimConfig
    learners: list[SimLearner]
    by_id: dict[str, SimLearner]
    events: list[Event]
    syncer: SyncerProtocol
    stopping: bool

    def push(self, t: float, item: q.Item) -> None: ...
    def syncer_outputs(self, now: float, outputs: list[SyncerOutput]) -> None: ...
    def on_up(self, now: float, learner: SimLearner, c: Contribution | Progress) -> None: ...
    def fail(self, now: float, learner: SimLearner, downtime: float) -> None: ...
    def leave(self, now: float, learner: SimLearner) -> None: ...


class Faults:
    """The run's fault timeline and the syncer's downtime: what the scenario does, when."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world
        cfg = world.cfg
        sc = scenario_of(cfg)
        self.syncer_down = False
        self.syncer_epoch = 0  # syncer processes so far - 1: timers and heals of dead ones drop
        self.timeline: list[Fault] = []
        self.applied: list[Fault] = []
        self.skipped = 0
        self._held: list[tuple[str, int, Contribution]] = []
        self._state: dict[str, Any] = {}
        if sc is None:
            return
        self.timeline = sc.timeline(cfg.learners, horizon_s(cfg, sc), cfg.seed)
        late = sc.late_learners()
        for learner in world.learners:
            learner.stalls, learner.net = Windows(), Windows()
            learner.up.outages = learner.down.outages = learner.net
            if learner.id in late:
                learner.member = "absent"

    def schedule(self) -> None:
        for i, f in enumerate(self.timeline):
            self.world.push(f.at, q.FaultDue(i))

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for f in self.applied:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        return {
            "scenario": self.world.cfg.scenario,
            "faults": len(self.timeline),
            "applied": kinds,
            "skipped": self.skipped,
        }

    # -- what the driver asks -------------------------------------------------------------
    def hold(self, learner: SimLearner, c: Contribution | Progress) -> None:
        """Reached the syncer while it is down: a contribution waits for its return."""
        if isinstance(c, Contribution):
            self._held.append((learner.id, learner.incarnation, c))

    def deferred(self, now: float, learner: SimLearner, item: q.Up | q.Down) -> bool:
        """A message due while its link is cut arrives when the link is back."""
        at = (learner.up if isinstance(item, q.Up) else learner.down).open_at(now)
        if at > now:
            self.world.push(at, item)
            return True
        return False

    def process_died(self, now: float, learner: SimLearner) -> None:
        """A killed learner's restarted process is not stopped: its stall ends."""
        if learner.stalls is not None and learner.net is not None:
            learner.stalls.end_early(now, "stall")
            learner.net.end_early(now, "stall")

    def on_item(self, now: float, item: q.FaultDue | q.SyncerUp) -> None:
        if isinstance(item, q.SyncerUp):
            self._restart_syncer(now)
            return
        f = self.timeline[item.index]
        if self.world.stopping or not self._reaches(f):
            self.skipped += 1
            return
        self.applied.append(f)
        self.world.events.append(Event(now, "launcher", Chaos(f.kind, f.target, f.duration)))
        self._apply(now, f)

    # -- the faults ---------------------------------------------------------------------
    def _reaches(self, f: Fault) -> bool:
        """Whether `f` can be applied now (module docstring)."""
        if f.kind == "kill_syncer":
            return not self.syncer_down
        learner = self.world.by_id[f.target]
        if f.kind in ("kill", "stall"):
            return learner.member == "in" and learner.phase not in (Phase.DOWN, Phase.DONE)
        if f.kind == "add":
            return learner.member == "absent"
        return not learner.finished if f.kind == "remove" else learner.member != "gone"

    def _apply(self, now: float, f: Fault) -> None:
        if f.kind == "kill_syncer":
            self._kill_syncer(now, f.duration)
            return
        world, learner = self.world, self.world.by_id[f.target]
        assert learner.stalls is not None and learner.net is not None
        if f.kind == "kill":
            world.fail(now, learner, f.duration)
        elif f.kind == "stall":
            self._stall(now, learner, f.end)
        elif f.kind in ("cut", "slow"):
            learner.net.add(now, f.end, 0.0 if f.kind == "cut" else 1.0 / f.factor, f.kind)
        elif f.kind == "add":
            learner.member = "in"
            if not self.syncer_down:  # else it joins when the syncer is back
                world.syncer_outputs(now, world.syncer.on_join(now, learner.id))
        elif f.kind == "remove":
            world.leave(now, learner)

    def _stall(self, now: float, learner: SimLearner, end: float) -> None:
        assert learner.stalls is not None and learner.net is not None
        learner.stalls.add(now, end, 0.0, "stall")
        learner.net.add(now, end, 0.0, "stall")
        if learner.phase is Phase.RUNNING and learner.step_at > now:  # its step ends later
            learner.step_at = learner.stalls.advance(now, learner.step_at - now)
            self.world.push(
                learner.step_at, q.StepDone(learner.id, learner.incarnation, learner.step_dt)
            )

    def _kill_syncer(self, now: float, duration: float) -> None:
        self._state = self.world.syncer.state_dict()  # what its snapshot and tape hold
        self.syncer_down = True
        self.syncer_epoch += 1
        self.world.push(now + duration, q.SyncerUp())

    def _restart_syncer(self, now: float) -> None:
        world = self.world
        plan = world.syncer.plan
        init = [torch.zeros(f.numel) for f in plan.fragments]
        syncer = SyncerProtocol(plan, init, world.cfg.syncer_config(), end=run_end(world.cfg))
        syncer.load_state_dict(self._state)
        world.syncer, self.syncer_down = syncer, False
        versions = [st["version"] for st in self._state["fragments"]]
        restored = Restored(0, 0, self._state["rounds_closed"], versions, 0)
        world.events.append(Event(now, "syncer", restored))
        for learner in world.learners:
            if learner.member != "in":
                continue
            if learner.phase in (Phase.RUNNING, Phase.WAITING, Phase.DONE, Phase.JOINING):
                past = learner.proto.rejoin_says(other_epoch=True)  # (joining: None, it heals)
                world.syncer_outputs(now, syncer.on_join(now, learner.id, past))
        held, self._held = self._held, []
        for lid, incarnation, c in held:
            learner = world.by_id[lid]
            if incarnation == learner.incarnation:
                world.on_up(now, learner, c)
