"""The live syncer's runtime: one lock around the protocol, its timers, the dispatch of its
outputs, the run's accounting and durability (tape, snapshots), and the background threads
(timers, the reaper of silent learners, snapshots).

Every protocol call happens under `lock`, through `process` for its outputs: a committed
merge goes to the tape *before* its update is queued to any learner; events go to the log
and into the accounting; timers into the heap; sends into the learners' outboxes.
"""

from __future__ import annotations

import copy
import heapq
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from atoll.config.options import SyncerOptions
from atoll.core.budget import BeatAnswer, RunEnd, StartBarrier, TokenBudget
from atoll.core.events import (
    Accepted,
    AuthRefused,
    DiskFailed,
    Event,
    Joined,
    Record,
    Refused,
    Restored,
    RunOver,
    SeenCheck,
    Snapshot,
    SnapshotFailed,
    SyncerStopped,
    ThreadDied,
    TransferBroken,
)
from atoll.core.fragments import FragmentPlan
from atoll.core.messages import Commit, FragmentUpdate, Progress, Pull, Send, SetTimer, TimerKey
from atoll.core.shards import owned
from atoll.core.syncer import SyncerConfig, SyncerProtocol
from atoll.eventlog import EventLog
from atoll.live.syncer.books import Books, new_accounts
from atoll.live.syncer.cpu import CpuSteps
from atoll.live.syncer.outbox import Control, Session
from atoll.live.syncer.roster import Roster
from atoll.live.syncer.store import RestoreResult, Tape, commit_record, restore, write_snapshot
from atoll.threads import guarded


def _exit(code: int) -> None:
    os._exit(code)


EXIT_THREAD_DIED = 70  # a background thread raised (EX_SOFTWARE): restart from the tape
EXIT_DISK = 75  # the tape could not be written (EX_TEMPFAIL): nothing unrecorded was sent


class SyncerRuntime:
    def __init__(
        self,
        plan: FragmentPlan,
        init: list[torch.Tensor],
        config: SyncerConfig,
        opts: SyncerOptions,
        events: EventLog | None = None,
    ) -> None:
        self.plan, self.opts = plan, opts
        served = owned(plan, opts.shard) if opts.shard.count > 1 else None
        # the window after the budget: a vanished learner is dropped after lost_after_s; one
        # still connected has finish_window_s to flush and leave
        end = RunEnd(TokenBudget(opts.token_budget), opts.lost_after_s + opts.finish_window_s)
        self.proto = SyncerProtocol(plan, init, config, served, end)
        self.events = events or EventLog(opts.run_dir / "events.jsonl")
        self.lock = threading.RLock()
        self.epoch = uuid.uuid4().hex[:12]
        self.sessions: dict[str, Session] = {}
        self.controls: dict[str, Control] = {}
        self.timers: list[tuple[float, int, TimerKey]] = []
        self._timer_seq = 0
        self._timer_cv = threading.Condition(self.lock)
        self.stopping = threading.Event()
        self.over = threading.Event()  # the run is over (the protocol's RunOver event)
        self.acct = new_accounts()
        self.cpu = CpuSteps()  # where this process's CPU goes (live/syncer/cpu.py)
        self.books = Books(self.acct)
        self.observers: list[Any] = []  # called with every event accounted (lock held)
        self.roster = Roster()  # each learner's figures (the page's rows)
        self.tape = Tape(opts.run_dir / "tape", fsync=opts.tape_fsync)
        self.snapshot_path = opts.run_dir / "snapshot.safetensors"
        self.restored = self._restore()
        self.books.started(self.epoch)
        self.barrier = StartBarrier(
            opts.expect_learners, start_at=self.acct.get("start_at") or None
        )
        self._prev_snapshot_seq = self.restored.snapshot_seq
        self.tape.open_segment(self.tape.next_seq)
        self._threads: list[threading.Thread] = []
        self.exit = _exit  # how a fatal error ends the process (tests replace it)
        self._snapshotting = threading.Lock()
        with self.lock:
            self.counted(time.time())  # a restored run's budget may be spent already

    # -- durability ---------------------------------------------------------------------------
    def _restore(self) -> RestoreResult:
        r = restore(self.proto, self.snapshot_path, self.tape)
        if r.found:
            self.acct.update(r.extra)
            self.acct["restarts"] = int(self.acct.get("restarts", 0)) + 1
            self.acct["lost_committed_rounds"] = (
                int(self.acct.get("lost_committed_rounds", 0)) + r.lost_committed_rounds
            )
            restored = Restored(
                snapshot_records=r.snapshot_seq,
                replayed=r.replayed,
                rounds_closed=self.proto.rounds_closed,
                versions=list(self.proto.version),
                lost_committed_rounds=r.lost_committed_rounds,
            )
            self.events.record("syncer", restored)
        return r

    def snapshot(self) -> None:
        """One at a time: the snapshot thread's and the end of the run's would share the
        temporary file."""
        with self._snapshotting, self.cpu.timed("snapshot"):
            self._snapshot()

    def _snapshot(self) -> None:
        with self.lock:
            seq = self.tape.next_seq
            # the tensors held, not copies: a merge replaces them and never writes into them
            state = self.proto.state_dict(self.opts.snapshot_history, copy=False)
            extra = copy.deepcopy(self.acct)  # written outside the lock
            self._tape_call(lambda: self.tape.open_segment(seq))
        write_snapshot(self.snapshot_path, state, seq, extra)
        self.tape.drop_before(self._prev_snapshot_seq)
        self._prev_snapshot_seq = seq
        self.events.record("syncer", Snapshot(tape_next=seq, rounds=state["rounds_closed"]))

    def _tape_call(self, fn: Any) -> Any:
        """A write to the tape; if the disk refuses it (full, read-only, out of descriptors)
        the process ends at once (EXIT_DISK), under the lock: the round it would record is
        never sent to anyone, and the supervisor restarts the syncer from what is on disk."""
        try:
            return fn()
        except OSError as exc:
            self.fatal(DiskFailed(error=str(exc), path=str(self.tape.folder)), EXIT_DISK)

    def fatal(self, record: Record, code: int) -> None:
        """Write the event (if the disk still takes it), say it on stderr, end the process."""
        import sys

        self.events.record("syncer", record)
        said = f"atoll syncer: {record.KIND} {record.to_dict()}; exiting with {code}"
        print(said, file=sys.stderr, flush=True)
        self.exit(code)
        raise SystemExit(code)  # `exit` does not return; if a test's does, nothing goes on

    # -- protocol outputs ---------------------------------------------------------------------
    def process(self, now: float, outputs: list) -> None:
        """Handle protocol outputs (lock held): every `Commit` to the tape first, then events,
        timers, sends (a `PushAnswer` is the handler's to send)."""
        for o in outputs:
            if isinstance(o, Commit):
                with self.cpu.timed("tape"):
                    rec = commit_record(self.proto, self.tape.next_seq, o.fragment, self.acct)
                    self._tape_call(lambda rec=rec: self.tape.append(rec))
        for o in outputs:
            if isinstance(o, Event):
                self._account(o)
                self.roster.observe(o, self.sessions)
                for observe in self.observers:
                    observe(o)
                self.events.write(o)
            elif isinstance(o, SetTimer):
                self._timer_seq += 1
                heapq.heappush(self.timers, (o.at, self._timer_seq, o.key))
                self._timer_cv.notify()
            elif isinstance(o, Send) and isinstance(o.message, FragmentUpdate):
                sess = self.sessions.get(o.to)
                if sess is not None:
                    sess.put_update(o.message, self.proto.coalesce)
            elif isinstance(o, Send) and isinstance(o.message, Pull):
                sess, ctl = self.sessions.get(o.to), self.controls.get(o.to)
                if sess is not None and ctl is not None and ctl.incarnation == sess.incarnation:
                    ctl.put(o.message)

    def record(self, record: Record) -> None:
        """An event of the driver's own (a transport refusal, a broken transfer): logged and
        counted as the protocol's events are."""
        now = time.time()
        with self.lock:
            self.process(now, [Event(now, "syncer", record)])

    def _account(self, e: Event) -> None:
        a = self.acct
        match e.data:
            case Accepted(bytes=nbytes, work_s=work_s):
                a["accepted"] += 1
                a["bytes_in"] += nbytes
                a["useful_s"] += work_s
                a["last_accepted"] = max(a.get("last_accepted") or e.t, e.t)  # goodput's window
            case Joined() if a.get("first_join") is None:
                a["first_join"] = e.t
            case Refused():
                a["refused"] += 1
            case TransferBroken():
                a["broken_transfers"] += 1
            case AuthRefused(count=count):
                a["auth_refused"] += count or 1
            case SeenCheck(lost_committed_rounds=lost):
                a["lost_committed_rounds"] += lost
            case RunOver():
                self.over.set()

    def lose(self, learner: str, sess: Session, why: str) -> None:
        with self.lock:
            sess.close()
            if self.sessions.get(learner) is sess:
                del self.sessions[learner]
                now = time.time()
                self.process(now, self.proto.on_lost(now, learner, why))

    def listening(self, ctl: Control, on: bool) -> None:
        """A learner's Pulls stream opened (`on`) or ended (lock held)."""
        now = time.time()
        if on:
            old = self.controls.get(ctl.learner)
            if old is not None:
                old.close()
            self.controls[ctl.learner] = ctl
        elif self.controls.get(ctl.learner) is ctl:
            del self.controls[ctl.learner]
        else:
            return
        sess = self.sessions.get(ctl.learner)
        if sess is not None and sess.incarnation == ctl.incarnation:
            self.process(now, self.proto.on_listening(now, ctl.learner, on))

    def can_hear(self, learner: str, incarnation: str) -> bool:
        ctl = self.controls.get(learner)
        return ctl is not None and not ctl.closed and ctl.incarnation == incarnation

    @property
    def stop_requested(self) -> bool:
        return self.proto.end.budget.stop_requested(self.total_tokens())

    def beat(
        self, now: float, learner: str, incarnation: str, final: bool,
        counters: tuple[int, int, float], progress: Progress,
    ) -> tuple[bool, BeatAnswer]:  # fmt: skip
        """A heartbeat (lock held): a joined session's counters (step, tokens, work seconds)
        go into the books, within bounds, and its step report to the protocol, which answers
        with the budget's state (`on_beat`). Returns (its session is known, the answer)."""
        sess = self.sessions.get(learner)
        known = sess is not None and sess.incarnation == incarnation
        if known:  # only a joined learner's counters count
            sess.last_seen = now
            sess.finishing = sess.finishing or final
            if self.books.beat(learner, incarnation, *counters):
                self.roster.beat(learner, incarnation, counters[0])
            self.process(now, self.proto.on_progress(now, progress))
        answer, out = self.proto.on_beat(now, self.total_tokens(), len(self.sessions))
        self.process(now, out)
        return known, answer

    def counted(self, now: float) -> None:
        """The books' tokens changed (lock held): the protocol decides whether that spends the
        budget (and later whether the run is over: `over` is set)."""
        self.process(now, self.proto.on_tokens(now, self.total_tokens()))

    def joined(self, now: float) -> None:
        """A learner joined (lock held): the run's start time once the expected learners
        are here."""
        start = self.barrier.joined(now, len(self.sessions))
        if start is not None:
            self.acct["start_at"] = start

    def total_tokens(self) -> int:
        return self.books.total_tokens()

    def epochs(self) -> list[str]:
        """The epochs of this run's syncer, this one included (newest last)."""
        return self.books.epochs()

    # -- threads ------------------------------------------------------------------------------
    def _timer_loop(self) -> None:
        with self.lock:
            while not self.stopping.is_set():
                if not self.timers:
                    self._timer_cv.wait(0.5)
                    continue
                at = self.timers[0][0]
                now = time.time()
                if now < at:
                    self._timer_cv.wait(min(at - now, 0.5))
                    continue
                _, _, key = heapq.heappop(self.timers)
                t0 = time.thread_time()
                outs = self.proto.on_timer(now, key)
                self.cpu.protocol_call(t0, outs)
                self.process(now, outs)

    def _reaper_loop(self) -> None:
        while not self.stopping.wait(0.25):
            self.reap(time.time())

    def reap(self, now: float) -> None:
        """Drop learners silent for `lost_after_s`, and close Pulls streams that have had no
        session of their incarnation for as long (they would hold a server thread)."""
        after = self.opts.lost_after_s
        with self.lock:
            silent = [(lid, s) for lid, s in self.sessions.items() if now - s.last_seen > after]
            orphans = [
                c
                for c in self.controls.values()
                if now - c.opened > after and not self._has_session(c.learner, c.incarnation)
            ]
            self.books.bound(self.sessions)
        for lid, s in silent:
            self.lose(lid, s, f"silent for more than {after} s")
        for c in orphans:
            c.close()

    def _has_session(self, learner: str, incarnation: str) -> bool:
        s = self.sessions.get(learner)
        return s is not None and s.incarnation == incarnation

    def _snapshot_loop(self) -> None:
        while not self.stopping.wait(self.opts.snapshot_every_s):
            try:
                self.snapshot()
            except OSError as exc:  # a full disk, no descriptors left: try again next time
                self.events.record("syncer", SnapshotFailed(error=str(exc)[:500]))

    def start_threads(self) -> None:
        for fn in (self._timer_loop, self._reaper_loop, self._snapshot_loop):
            t = guarded(fn.__name__, fn, self.thread_died)
            t.start()
            self._threads.append(t)

    def thread_died(self, name: str, exc: BaseException) -> None:
        """A background thread of this syncer raised: recorded, and the process exits."""
        self.fatal(ThreadDied(thread=name, error=repr(exc)[:500]), EXIT_THREAD_DIED)

    def close_streams(self) -> None:
        self.stopping.set()
        with self.lock:
            for s in self.sessions.values():
                s.close()
            for c in self.controls.values():
                c.close()

    def finish(self, final_dir: Path | None = None) -> None:
        """The end of the run: close every open round, snapshot, write the final model."""
        with self.lock:
            now = time.time()
            self.process(now, self.proto.close_all(now))
        self.snapshot()
        if final_dir is not None:
            from safetensors.torch import save_file

            with self.lock:
                params = {k: v.contiguous() for k, v in self.proto.global_params().items()}
            save_file(params, str(final_dir / "final.safetensors"))
        self.tape.close()
        self.events.record("syncer", SyncerStopped(rounds=self.proto.rounds_closed))
