"""The learner protocol's settings (`LearnerConfig`), its lifecycle (`Phase`) and the typed
records it hands its drivers besides sends and events (`Boundary`, `HealRequest`).

When fragments are sent (`schedule`):
- "pull" (default): the syncer paces the rounds. It sends a tiny Pull for fragment p on its own
  clock, one schedule slot per measured step time; the learner sends p at its next step
  boundary (`take_pulled`). All learners thus contribute to the same round at about the same
  wall time whatever their speed, and a slow learner simply contributes fewer steps (its
  tokens^2/steps weight is smaller). The learner reports its step time in a Progress message
  after every step.
- "push": the learner sends p after its own step s with s mod H == t_p. Learners of different
  speeds then drift out of phase, and rounds gather them only if the syncer waits.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from atoll.compat import StrEnum
from atoll.core.choices import check_choices
from atoll.core.events import Event
from atoll.core.messages import Outgoing, Send
from atoll.core.receipt import check_mode
from atoll.errors import ConfigError


@dataclass(frozen=True)
class LearnerConfig:
    tau: int = 2
    codec: str = "int4"
    group: int = 64
    error_feedback: bool = True
    receipt: str = "overwrite"
    alpha: float = 0.5
    block: bool = True  # wait at step s+tau for the answer to the send at step s ...
    max_wait_s: float = math.inf  # ... at most this long (0: never wait; inf: until it comes)
    schedule: str = "pull"  # "pull" (syncer-paced) or "push" (step-count schedule)

    def validate(self, H: int) -> None:
        if not 0 <= self.tau < H:
            raise ConfigError("tau", self.tau, f"an integer in [0, H={H}) (overlap steps)")
        check_choices(self)
        if self.group < 1:
            raise ConfigError("group", self.group, "an integer >= 1")
        check_mode(self.receipt, self.alpha)
        if not self.max_wait_s >= 0:
            raise ConfigError("max_wait_s", self.max_wait_s, "a number >= 0 (seconds; inf)")


class Phase(StrEnum):
    """A learner's lifecycle.

    JOINING  until the first heal (a learner never trains from its own initialisation)
    RUNNING  stepping
    WAITING  at a step boundary, for an answer due before the next step (`max_wait_s`)
    DONE     its run is over: the token budget is spent (its share of it, or the syncer said
             stop) and the final flush was sent
    DOWN     its process died (the driver says so: `on_down`); a new process is a new protocol
    """

    JOINING = "joining"
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    DOWN = "down"


@dataclass(frozen=True)
class HealRequest:
    """Learner -> syncer: load every fragment again (a delta that does not chain onto what it
    has, or a refusal whose action is to heal): of the syncer (the shard) serving
    `fragment` (-1: all)."""

    reason: str
    fragment: int = -1


@dataclass(frozen=True)
class Boundary:
    """What a learner does at a step boundary (`LearnerProtocol.boundary`): deliver `sends`,
    record `events`, then step again (`wait_s == 0` and not `done`), wait for an answer at
    most `wait_s` seconds (math.inf: until it arrives; call `boundary` again when something
    arrives or the time is up), or stop: `done`, the final flush is in `sends`."""

    sends: list[Send] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    wait_s: float = 0.0
    done: bool = False


def supersede(old: Outgoing, new: Outgoing) -> Outgoing:
    """A newer send of a fragment in place of an older one still waiting to go out: its delta
    is measured from the same base and so holds the older one's progress; it carries the older
    one's work (goodput) too."""
    if old.fragment != new.fragment:
        raise ValueError(f"fragment {new.fragment} cannot supersede a send of {old.fragment}")
    return dataclasses.replace(new, work_s=new.work_s + old.work_s)


@dataclass
class Outstanding:
    """A send of a fragment not yet applied: its number, the step it was taken at, the local
    value then (receipt mode "carry" only) and the counters it carried."""

    seq: int
    step: int
    at_send: torch.Tensor | None
    steps: int
    tokens: int
    answered: bool = False

    def state(self) -> tuple:
        at = None if self.at_send is None else self.at_send.clone()
        return (self.seq, self.step, at, self.steps, self.tokens, self.answered)

    @staticmethod
    def of(st: tuple) -> Outstanding:
        s, k, a, n, t, ans = st
        return Outstanding(s, k, None if a is None else a.clone(), n, t, ans)
