"""The syncer protocol state machine (sans-I/O).

It holds the global value Theta_p and outer-optimizer state of every fragment. Inputs:
`on_join` (a learner (re)connects: it gets a Heal), `on_lost`, `on_contribution`, `on_timer`.
Outputs: `Send` (to a learner), `SetTimer`, and `Event`s for the stream.

Pacing (`schedule`): with "pull" (default) the syncer keeps a tick clock at the measured step
time (EMA of the learners' Progress reports); at tick g it sends Pull for every fragment with
offset g mod H, so each fragment is synchronised once per H ticks and all learners contribute
to the same round whatever their speed. With "push" the learners send on their own step count.

Closing a round for fragment p:
 1. contributions are kept per learner (a newer one from the same learner replaces the older);
 2. once `quorum` learners have contributed, the round stays open for the grace window
    (grace.py), or closes at once if every live learner has contributed;
 3. each learner's outer gradient is taken against the current value:
        theta_m = Theta_pub[base_version] - delta_m ;  Delta_m = Theta_p - theta_m
 4. weights tokens^2/steps, merge (RDA, embeddings: weighted mean), outer step, version + 1;
 5. the new value is sent to every live learner: in full (fp32, default), or as the change
    of the public value quantized with `down_codec`; the syncer keeps the exact Theta and the
    learners' public copy separately, so what is not sent is carried into the next broadcast
    (error feedback held on the syncer) and the global parameters are never degraded.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from atoll.core import codec
from atoll.core.counters import token_weight
from atoll.core.events import Event
from atoll.core.fragments import FragmentPlan
from atoll.core.grace import GracePolicy
from atoll.core.merge import MERGES, merge_fragment
from atoll.core.messages import (
    Contribution,
    FragmentUpdate,
    Heal,
    Progress,
    Pull,
    Send,
    SetTimer,
)
from atoll.core.outer import OuterOptimizer, OuterState
from atoll.errors import ConfigError


@dataclass(frozen=True)
class SyncerConfig:
    quorum: int = 1
    tau: int = 2
    grace: bool = True
    grace_gamma: float = 0.5
    grace_ema: float = 0.1
    merge: str = "rda"
    weighting: str = "tokens"  # "tokens" (tokens^2/steps) or "uniform"
    outer: str = "sgd"  # measured best at small scale; "nesterov" (0.7, 0.9) is the paper's
    outer_lr: float = 1.0
    outer_momentum: float = 0.9
    outer_delay: int = 4
    down_codec: str = "fp32"
    group: int = 64
    history: int = 64  # public versions kept per fragment to resolve learners' base versions
    schedule: str = "pull"  # "pull": the syncer paces rounds; "push": learners' step counts

    def validate(self) -> None:
        if self.merge not in MERGES:
            raise ConfigError("merge", self.merge, f"one of {MERGES}")
        if self.weighting not in ("tokens", "uniform"):
            raise ConfigError("weighting", self.weighting, "'tokens' or 'uniform'")
        codec.check_scheme(self.down_codec, "down_codec")
        if self.history < 2:
            raise ConfigError("history", self.history, "an integer >= 2")
        if self.schedule not in ("pull", "push"):
            raise ConfigError("schedule", self.schedule, "'pull' or 'push'")


@dataclass
class _Pending:
    theta: torch.Tensor
    weight: float
    c: Contribution
    staleness: int
    nbytes: int
    arrived: float


class SyncerProtocol:
    def __init__(
        self, plan: FragmentPlan, init: list[torch.Tensor], config: SyncerConfig | None = None
    ) -> None:
        self.plan = plan
        self.cfg = config or SyncerConfig()
        self.cfg.validate()
        if len(init) != plan.P:
            raise ValueError(f"need {plan.P} initial fragment values, got {len(init)}")
        self.theta = [v.detach().float().clone().reshape(-1) for v in init]
        self.public = [v.clone() for v in self.theta]
        self.version = [0] * plan.P
        self.history: list[OrderedDict[int, torch.Tensor]] = [
            OrderedDict({0: v.clone()}) for v in self.public
        ]
        self.outer = OuterOptimizer(
            self.cfg.outer, self.cfg.outer_lr, self.cfg.outer_momentum, self.cfg.outer_delay
        )
        self.outer_state = [OuterState() for _ in range(plan.P)]
        self.grace = GracePolicy(
            self.cfg.quorum, self.cfg.tau, self.cfg.grace_gamma, self.cfg.grace_ema, self.cfg.grace
        )
        self.live: set[str] = set()
        self.pending: list[dict[str, _Pending]] = [{} for _ in range(plan.P)]
        self.quorum_at: list[float | None] = [None] * plan.P
        self.round_id = [0] * plan.P
        self.rounds_closed = 0
        self.tick = -1  # pull clock: -1 until the first step time is measured

    # -- membership --------------------------------------------------------------------------
    def heal_message(self) -> Heal:
        return Heal(
            tuple(
                FragmentUpdate(
                    p,
                    self.version[p],
                    "full",
                    self.version[p],
                    codec.encode(self.public[p], "fp32"),
                    (),
                    0.0,
                )
                for p in range(self.plan.P)
            )
        )

    def on_join(self, now: float, learner: str) -> list:
        self.live.add(learner)
        return [
            Send(learner, self.heal_message()),
            Event(now, "joined", "syncer", {"learner": learner}),
        ]

    def on_lost(self, now: float, learner: str) -> list:
        self.live.discard(learner)
        out: list = [Event(now, "lost", "syncer", {"learner": learner})]
        for p in range(self.plan.P):
            out += self._maybe_close(now, p)
        return out

    # -- rounds ------------------------------------------------------------------------------
    def on_contribution(self, now: float, c: Contribution) -> list:
        p = c.fragment
        reason = self._check(c)
        theta_m = None
        if reason is None:
            try:
                delta = codec.decode(c.payload, self.plan.fragments[p].numel)
                theta_m = self.history[p][c.base_version] - delta
            except codec.CodecError as exc:
                reason = f"bad payload: {exc}"
        if reason is not None:
            return [
                Event(
                    now,
                    "refused",
                    "syncer",
                    {"learner": c.learner, "fragment": c.fragment, "reason": reason},
                )
            ]
        if c.step_time > 0:
            self.grace.step.update(c.step_time)
        weight = token_weight(c.tokens, c.steps) if self.cfg.weighting == "tokens" else 1.0
        self.pending[p][c.learner] = _Pending(
            theta_m, weight, c, self.version[p] - c.base_version, len(c.payload), now
        )
        return self._maybe_close(now, p)

    def on_progress(self, now: float, msg: Progress) -> list:
        """A learner's step report: measures the step time; starts the pull clock."""
        if msg.learner not in self.live or not msg.step_time > 0:
            return []
        self.grace.step.update(msg.step_time)
        if self.cfg.schedule == "pull" and self.tick < 0:
            self.tick = 0
            return [SetTimer(now, ("pull", 0))]
        return []

    def _pull(self, now: float, tick: int) -> list:
        out: list = []
        for f in self.plan.fragments:
            if f.offset == tick % self.plan.H:
                out += [Send(lid, Pull(f.index, tick, now)) for lid in sorted(self.live)]
        self.tick = tick + 1
        return out + [SetTimer(now + (self.grace.step.value or 1.0), ("pull", tick + 1))]

    def on_timer(self, now: float, key: tuple) -> list:
        if key[0] == "pull":
            return self._pull(now, key[1])
        _, p, rid = key
        if rid != self.round_id[p] or not self.pending[p]:
            return []
        return self._close(now, p)

    def _check(self, c: Contribution) -> str | None:
        if not 0 <= c.fragment < self.plan.P:
            return f"fragment {c.fragment} out of range [0, {self.plan.P})"
        if c.learner not in self.live:
            return f"learner {c.learner} has not joined"
        if c.base_version not in self.history[c.fragment]:
            return (
                f"base version {c.base_version} of fragment {c.fragment} is not held "
                f"(current {self.version[c.fragment]}); the learner must heal"
            )
        if c.steps < 0 or c.tokens < 0:
            return "negative counters"
        return None

    def _maybe_close(self, now: float, p: int) -> list:
        pend = self.pending[p]
        if not pend or len(pend) < min(self.cfg.quorum, max(len(self.live), 1)):
            return []
        if self.quorum_at[p] is None:
            self.quorum_at[p] = now
            first = min(x.c.sent_at for x in pend.values())
            self.grace.to_quorum.update(max(now - first, 0.0))
        everyone = self.live <= set(pend)
        window = self.grace.window()
        if everyone or window <= 0 or now >= self.quorum_at[p] + window:
            return self._close(now, p)
        return [SetTimer(self.quorum_at[p] + window, ("close", p, self.round_id[p]))]

    def _close(self, now: float, p: int) -> list:
        pend = self.pending[p]
        frag = self.plan.fragments[p]
        ids = sorted(pend)
        deltas = [self.plan.split(p, self.theta[p] - pend[i].theta) for i in ids]
        weights = [pend[i].weight for i in ids]
        merged = merge_fragment(deltas, weights, frag.is_embedding, self.cfg.merge)
        delta = torch.cat([m.reshape(-1) for m in merged])
        self.theta[p] = self.outer.step(self.theta[p], delta, self.outer_state[p])
        self.version[p] += 1
        v = self.version[p]
        if self.cfg.down_codec == "fp32":
            self.public[p] = self.theta[p].clone()
            update = FragmentUpdate(
                p,
                v,
                "full",
                v - 1,
                codec.encode(self.public[p], "fp32"),
                tuple((i, pend[i].c.seq) for i in ids),
                now,
            )
        else:
            frame = codec.encode(
                self.theta[p] - self.public[p], self.cfg.down_codec, self.cfg.group
            )
            self.public[p] = self.public[p] + codec.decode(frame)
            update = FragmentUpdate(
                p, v, "delta", v - 1, frame, tuple((i, pend[i].c.seq) for i in ids), now
            )
        hist = self.history[p]
        hist[v] = self.public[p].clone()
        while len(hist) > self.cfg.history:
            hist.popitem(last=False)
        quorum_wait = (self.quorum_at[p] or now) - min(x.c.sent_at for x in pend.values())
        event = Event(
            now,
            "round_closed",
            "syncer",
            {
                "fragment": p,
                "version": v,
                "participants": ids,
                "weights": [round(w, 3) for w in weights],
                "staleness": [pend[i].staleness for i in ids],
                "quorum_wait_s": quorum_wait,
                "grace_s": now - (self.quorum_at[p] or now),
                "bytes_in": sum(pend[i].nbytes for i in ids),
                "bytes_out": len(update.payload) * len(self.live),
            },
        )
        # time to deliver the result: the links are taken as symmetric, so the answer is
        # expected to travel as fast as the contributions did (scaling by the size ratio would
        # also scale the latency, which dominates small fragments, and starve the window)
        uploads = [max(pend[i].arrived - pend[i].c.sent_at, 0.0) for i in ids]
        self.grace.sync.update(max(uploads))
        self.pending[p] = {}
        self.quorum_at[p] = None
        self.round_id[p] += 1
        self.rounds_closed += 1
        return [Send(lid, update) for lid in sorted(self.live)] + [event]

    def global_params(self) -> dict[str, torch.Tensor]:
        """The exact global parameters by name (copies)."""
        out = {}
        for p, f in enumerate(self.plan.fragments):
            for name, t in zip(f.names, self.plan.split(p, self.theta[p]), strict=True):
                out[name] = t.clone()
        return out
