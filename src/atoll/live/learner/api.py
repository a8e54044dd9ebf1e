"""The learner library: Decoupled DiLoCo for any PyTorch training loop (`Learner`'s docstring
has the loop).

`Learner` drives atoll.core.learner.LearnerProtocol and decides nothing itself: at every step
boundary (`step()`, in the training thread) it hands the protocol what arrived and does what
`LearnerProtocol.boundary` says (hand the due contributions to the communication side, wait at
most `wait_s`, or end the run: ending.py). The communication side (atoll.live.comm) encodes and
sends, in a child process (`comm="process"`: no thread competes for the training process's GIL)
or in threads (`comm="thread"`); ports.py, messages.py. On a rank of a torch.distributed group
it is an island (island.py). If the syncer goes away, the communication side reconnects and
resumes (keeps local progress when the syncer still holds its base versions, else heals).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
import uuid
from collections import deque
from typing import Any

import torch

from atoll.core import codec
from atoll.core.budget import BudgetShare
from atoll.core.events import CommFatal, Event, Step, Training
from atoll.core.fragments import FlatFragments, FragmentPlan, FragmentStore
from atoll.core.learner import Boundary, HealRequest, LearnerProtocol
from atoll.core.messages import Heal, Outgoing, Send, UpdateKind
from atoll.eventlog import EventLog
from atoll.live.address import check_addresses
from atoll.live.comm.messages import (
    FINAL_BEAT_S,
    BeatDone,
    CommFailed,
    CommOptions,
    CommStatus,
    FromComm,
    HealReceived,
    JoinRetry,
    NotSent,
    PullReceived,
    RefusalReceived,
    RequestHeal,
    Reset,
    StepState,
    Submit,
    UpdateReceived,
    Welcomed,
)
from atoll.live.comm_mode import learners_on_host, resolve_comm
from atoll.live.learner import ending, joining
from atoll.live.learner.island import (
    Island,
    IslandMember,
    Leading,
    is_member,
    is_sharded,
    unwrap,
)
from atoll.live.learner.options import LearnerOptions
from atoll.live.learner.ports import ClosedPort, Port, ProcessPort, ThreadPort
from atoll.wire.auth import load_secret


class Learner:
    """One learner of a Decoupled DiLoCo run: your model and inner optimizer, trained in your
    own loop, kept in sync with the run's syncer in the background.

        opts = atoll.LearnerOptions(learner_id="L0", run_id="myrun", secret_file="secret.txt")
        learner = atoll.Learner(model, opt, "host:7070", opts)
        for batch in data:
            ...; loss.backward(); opt.step(); opt.zero_grad()
            learner.step(tokens=batch.numel())
            if learner.should_stop:  # the run's token budget is spent
                break
        learner.finish()

    The constructor returns once the model holds the syncer's values (a heal; the inner
    optimizer's state is kept across heals); communication runs in the background.

    What stops it is raised in one line, never an exit of your process: `ConfigError` (a bad
    argument, a model not the syncer's), and the `atoll.LearnerError`s (joining.py):
    `AuthError` (the syncer refuses the secret or run id: at once), `JoinError` (it refuses
    this learner, e.g. taken for another shard),
    `JoinTimeoutError` (no heal within `connect_timeout_s`; meanwhile "connection refused at
    HOST:PORT, retrying (n)" on the "atoll.learner" logger), `CommError` from `step()`. On a
    torch.distributed group every rank makes the same calls; rank 0 talks to the syncer.
    """

    def __new__(cls, *args: Any, group: Any = None, **kwargs: Any) -> Learner:
        """A rank of a torch.distributed island other than its rank 0 is an `IslandMember`
        (atoll.live.learner.island); rank 0, or a process alone, is a `Learner`."""
        if cls is Learner and is_member(group):  # not a Learner: no __init__ runs after this
            return IslandMember(*args, group=group, **kwargs)  # type: ignore[return-value]
        return object.__new__(cls)

    def __init__(
        self,
        model: torch.nn.Module,
        inner_optimizer: Any = None,
        syncer: str = "127.0.0.1:7070",
        options: LearnerOptions | None = None,
        *,
        group: Any = None,
    ) -> None:
        """Join the syncer at `syncer` ("host:port"; a sharded syncer's "host:port,..." in
        shard order) and block until healed from it. `inner_optimizer`: yours (torch.optim
        or not), kept and never stepped here. `options`: the rest (`LearnerOptions`).
        `group`: a torch.distributed group of 2+ ranks makes it an island (every rank calls
        `Learner` alike; rank 0 talks to the syncer: island.py); None: the default group when
        initialised with 2+ ranks, else one process."""
        o = self.options = options if options is not None else LearnerOptions()
        syncer = ",".join(check_addresses(syncer))
        self.island = Island.of(dict(unwrap(model).named_parameters()), group)
        if self.island is not None:  # its talking rank (the other ranks: IslandMember)
            model = unwrap(model)
            self.island.check_same(dict(model.named_parameters()))
        # "auto": a child process with 2+ cores per learner process running on this machine
        comm = resolve_comm(o.comm, learners_on_host() if o.comm == "auto" else 1)
        if comm == "thread" and o.switch_interval_s is not None:
            sys.setswitchinterval(o.switch_interval_s)
        self.model = model
        self.optimizer = inner_optimizer
        self.address = syncer
        self.id = o.learner_id or f"learner-{uuid.uuid4().hex[:6]}"
        self.incarnation = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.events = o.events if isinstance(o.events, EventLog) else EventLog(o.events)
        self.started = time.time()
        self.params = dict(model.named_parameters())
        self.proto: LearnerProtocol | None = None
        # counters (the step ones are reported in heartbeats)
        self.steps_done = 0
        self.tokens_done = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.refused = 0
        self.reconnects = 0
        self.pulls = 0
        self.pull_latency_s: deque[float] = deque(maxlen=256)  # syncer's send -> comm side
        self._connected = False
        self.budget = BudgetShare()  # the syncer's answers feed it from the first heartbeat
        self._welcomes = joining.Welcomes()  # the syncer's (each shard's) newest
        self._submitted = 0
        self._comm_status = CommStatus()
        self._submits: list[Submit] = []
        self._last_step_t = 0.0
        self._first_step_logged = False
        sharded = {n for n, t in self.params.items() if is_sharded(t)}  # FSDP2: heal in full
        secret = o.secret if o.secret is not None else load_secret(o.secret_file)
        self._comm = CommOptions(
            address=syncer, learner_id=self.id, incarnation=self.incarnation, run_id=o.run_id,
            secret=secret, tls_ca=o.tls_ca, shape_mbps=o.shape_mbps, heartbeat_s=o.heartbeat_s,
            events_path=str(self.events.path) if self.events.path else None,
            faults_path=o.faults_file,  # chaos only (atoll.live.comm.faults)
            digests=tuple((n, codec.digest(t)) for n, t in self.params.items() if n not in sharded),
            ranks=self.island.size if self.island is not None else 1,
        )  # fmt: skip
        with Leading(self.island):
            self.port = self._open_port(comm, self._comm)
            self._await_first_heal(o.connect_timeout_s)

    def _fragments(self, plan: FragmentPlan) -> FragmentStore:
        """Where the protocol reads and writes fragment values (on an island, on every rank)."""
        island = self.island
        return (
            FlatFragments(plan, self.params)
            if island is None
            else island.fragments(plan, self.params)
        )

    def _open_port(self, comm: str, opts: CommOptions) -> Port:
        """The communication side: a child process or threads of this one."""
        if comm == "process":
            return ProcessPort(opts, sum(t.numel() for t in self.params.values()), len(self.params))
        return ThreadPort(opts)

    # -- start-up -----------------------------------------------------------------------------
    def _await_first_heal(self, timeout: float) -> None:
        """Wait for the Welcome and the first heal; whatever stops it (a model that is not the
        syncer's, a refusal, no heal in time) closes the communication side first."""
        try:
            joining.first_heal(self, timeout)
        except BaseException:
            self.port.abort()  # nothing to send yet
            self.close()
            raise

    def _apply_heal(self, heal: Heal) -> None:
        assert self.proto is not None
        now = time.time()
        self.bytes_down += heal.nbytes
        for e in self.proto.on_heal(now, heal):  # a new generation: older sends are obsolete
            since = now - self.started
            data = dataclasses.replace(e.data, incarnation=self.incarnation, since_start_s=since)
            self.events.record(self.id, data, now)
        fragments = tuple(u.fragment for u in heal.updates)
        self.port.send(Reset(self.proto.generation, fragments))
        self._flush()
        self._last_step_t = time.time()

    # -- the training thread ------------------------------------------------------------------
    @property
    def should_stop(self) -> bool:
        """True once the run's token budget is spent: check it after `step()` and leave the
        loop, then call `finish()`. The learner protocol's word: the syncer said the run is
        over (asked at once when this learner has trained its share of what its last answer
        said was left). Always False for a syncer without a budget (it runs until stopped)."""
        return self.proto is not None and self.proto.should_stop

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def work_s(self) -> float:
        """Step-seconds trained since the first heal (reported in heartbeats)."""
        return self.proto.work_s if self.proto is not None else 0.0

    def step(self, tokens: int) -> None:
        """Call after every inner optimizer step, with the tokens that step trained on. Applies
        received global fragments (at this step boundary), hands over the contributions now
        due, and returns; it does no network I/O and no encoding. It waits only where
        `wait_s` > 0 allows (an answer due before the next step). On an island, `tokens` is
        this rank's: the island's step counts every rank's. Raises `CommError` (or
        `AuthError`) when nothing can reach the syncer any more: the process should end, and
        a restarted one heals from the syncer."""
        if self.island is not None:
            tokens = self.island.total(tokens)
        with Leading(self.island, lambda: self.should_stop):
            self._step(tokens)

    def _step(self, tokens: int) -> None:
        proto = self.proto
        assert proto is not None, "learner is closed"
        now = time.time()
        dt = now - self._last_step_t
        self._last_step_t = now
        if not self._first_step_logged:
            self._first_step_logged = True
            ranks = self.island.size if self.island is not None else 1
            self.events.record(self.id, Training(self.incarnation, now - self.started, ranks), now)
        self._drain()
        self.steps_done += 1
        self.tokens_done += tokens
        self._outputs(proto.on_step(now, tokens, dt))
        b = self._boundary(proto.boundary(now))
        while b.wait_s > 0:  # an answer is due before the next step: wait, at most wait_s
            item = self.port.get(min(b.wait_s, 1.0))
            if item is not None:
                self._handle(item)
            b = self._boundary(proto.boundary(time.time()))
        if self.steps_done % 50 == 0:
            self._report()

    def _report(self) -> None:
        """The `step` event: counters, and the bytes on the wire when measured."""
        wire = self._comm_status.wire or (None, None)
        step_time = self.proto.step_time.value if self.proto else None
        lat = self.pull_latency_s  # the median of recent ones, in ms
        latency = round(1e3 * statistics.median_high(lat), 3) if lat else None
        self.events.record(self.id, Step(
            self.incarnation, self.steps_done, self.tokens_done, step_time, self.pulls, latency,
            wire[0], wire[1],
        ))  # fmt: skip

    def _boundary(self, b: Boundary) -> Boundary:
        """Do what the protocol decided at a step boundary, and hand this step's state over."""
        self._outputs([*b.events, *b.sends])
        self._flush()
        return b

    def _outputs(self, outputs: list[Event | Send]) -> None:
        """Protocol outputs: events to the log; contributions and heal requests to the
        communication side (step reports go up in its heartbeats)."""
        for o in outputs:
            if isinstance(o, Event):
                self.events.write(o)
            elif isinstance(o.message, Outgoing):
                self._submits.append(self.port.submit(o.message))
                self._submitted += 1
            elif isinstance(o.message, HealRequest):
                self.port.send(RequestHeal(o.message.fragment))

    def _flush(self) -> None:
        """Hand this step's state over: one message to the communication side."""
        p = self.proto
        if p is None:
            return
        self.port.send(
            StepState(
                steps=self.steps_done,
                tokens=self.tokens_done,
                work_s=p.work_s,
                step_time=p.step_time.value or 0.0,
                rejoin=p.rejoin_says(),
                submits=tuple(self._submits),
                ask=self.budget.ask(p.tokens),
            )
        )
        self._submits = []

    def _drain(self) -> None:
        for item in self.port.get_all():
            self._handle(item)

    def _status(self, st: CommStatus) -> None:
        if st.stop:
            self.budget.stop()
        if st.budget is not None:
            self.budget.answer(*st.budget)
        if st.seq < self._comm_status.seq:
            return  # an older snapshot that overtook a newer one: keep the newer counters
        self._comm_status = st
        self._connected = st.connected
        self.bytes_up = st.bytes_up
        self.reconnects = st.reconnects

    def _handle(self, item: FromComm) -> None:
        proto = self.proto
        assert proto is not None
        match item:
            case UpdateReceived(u, value):
                self.bytes_down += len(u.payload)
                # decoded by the communication side (from the child: in a slot or an array);
                # a delta is only read (on_update): it may be read where it is
                keep = u.kind == UpdateKind.FULL
                tensor = self.port.value_in(u.fragment, value, copy=keep)
                try:
                    self._outputs(proto.on_update(time.time(), u, tensor))
                finally:
                    self.port.done_with(value)
            case PullReceived(pull, received_at):
                self.pulls += 1
                self.pull_latency_s.append(max(received_at - pull.at, 0.0))
                self._outputs(proto.on_pull(time.time(), pull))
            case CommStatus() as st:
                self._status(st)
            case HealReceived(heal):
                self._apply_heal(heal)
            case RefusalReceived(fragment, reason, action):
                self.refused += 1
                self._outputs(proto.on_refused(time.time(), fragment, reason, action))
            case NotSent(fragment, reason):
                self.refused += 1
                self._outputs(proto.on_unsendable(time.time(), fragment, reason))
            case CommFailed(reason) as failed:  # nothing would reach the syncer again: stop
                self.events.record(self.id, CommFatal(reason))
                raise joining.failure(self, failed)
            case JoinRetry():
                pass  # a shard not yet joined: said while joining
            case Welcomed(data):  # a rejoin: a heal follows, or it resumes
                w, restarted = self._welcomes.take(data)
                self._outputs(proto.on_welcome(time.time(), restarted, w.heal, w.served))
            case BeatDone():
                pass  # a late answer to `beat_once`

    def _queued(self) -> bool:
        """Whether a contribution handed over is not yet sent or not yet answered."""
        st = self._comm_status
        return st.received < self._submitted or st.queued > 0

    def finish(self, timeout: float = 10.0, away_s: float = 60.0) -> None:
        """End this learner's run: call once, after the loop (whether `should_stop` ended it
        or your data did). Sends every fragment's remaining work once, waits (bounded:
        `timeout` seconds once connected) for it to be merged, reports the final counters and
        closes; the learner is unusable after. A syncer that is away (restarting) is waited
        for up to `away_s` seconds: the work trained meanwhile is merged when it is back."""
        with Leading(self.island, lambda: True):
            self._finish(timeout, away_s)

    def _finish(self, timeout: float, away_s: float) -> None:
        if self.proto is not None and self.proto.healed:
            ending.final_flush(self, self.proto, timeout, away_s)
        self.beat_once()
        self._drain()
        self._report()
        self.close()

    def beat_once(self, timeout: float = FINAL_BEAT_S + 1.0) -> None:
        """Report the final counters synchronously; counters the syncer never counted are
        reported (`final_beat_lost`): the run's books miss those steps."""
        ending.beat_once(self, timeout)

    def close(self) -> None:
        port = getattr(self, "port", None)
        if port is not None:
            port.close()
            self.port = ClosedPort()
        if getattr(self, "proto", None) is not None:
            self.proto.delta_out = None  # no more shared slots

    def __enter__(self) -> Learner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
