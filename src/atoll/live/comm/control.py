"""The control channel (a TCP connection of its own: control traffic stays off the bulk path):
heartbeats, and with the pull schedule the Pulls stream.

Heartbeats carry the learner's counters (steps, tokens, step time, step-seconds), which also
pace the syncer's pull clock; none goes out while the training process is stopped (child
process mode reads /proc/<pid>/stat), so that a SIGSTOPped learner is declared lost. A reply
may end the run (`stop`), tell the tokens left in the budget and the learners live (passed on
as given: the training side decides its share), or say the syncer does not know us (or
restarted): the Join stream is then reopened.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from atoll.core.messages import Progress
from atoll.core.pacing import mean_step_time
from atoll.live.comm.messages import FINAL_BEAT_S, PullReceived, StepState
from atoll.live.comm.part import Part
from atoll.live.comm.session import StepReports
from atoll.wire import atoll_pb2 as pb
from atoll.wire import convert


def process_stopped(pid: int) -> bool:
    """True while process `pid` is stopped (SIGSTOP, SIGTSTP, a debugger), from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :][:1] in ("T", "t")


@dataclass(eq=False)
class Control(Part):
    """The beat and ctl threads, on the control channel."""

    steps: StepReports
    # the previous heartbeat's (steps, work_s)
    _last: tuple[int, float] | None = field(default=None, init=False)

    # -- heartbeats ---------------------------------------------------------------------------
    def beat(self, st: StepState, final: bool = False) -> pb.Beat:
        """A heartbeat carrying the learner's counters from step state `st`; its step time is
        the mean of the steps since the previous beat (core/pacing.py's rule); `final`: the
        last, after the final flush (the syncer then counts the session's end as a finish)."""
        step_time = mean_step_time(self._last, st.steps, st.work_s, st.step_time)
        self._last = (st.steps, st.work_s)
        p = Progress(self.id, st.steps, step_time, time.time(), st.work_s)
        return convert.beat(self.id, self.o.incarnation, st.tokens, p, final)

    def beat_once(self, within_s: float = FINAL_BEAT_S) -> bool:
        """Report the final counters (tokens, step-seconds) synchronously, until the syncer
        has counted them (its reply knows this session) or `within_s` has passed. The call
        waits for a channel that is still reconnecting (a syncer just back from a restart):
        failing fast there lost a finished learner's last steps from the run's books."""
        ch = self.channels
        st = self.steps.state
        if st is None:
            return False
        until = time.time() + within_s
        beat = self.beat(st, final=True)
        while (left := until - time.time()) > 0:
            try:
                reply = ch.control_stub.Heartbeat(
                    beat, metadata=ch.metadata, timeout=left, wait_for_ready=True
                )
            except grpc.RpcError:
                reply = None
            if reply is not None and reply.known:
                return True
            if self.flags.closing.wait(min(0.1, max(until - time.time(), 0))):
                break
        return False

    def run_beats(self) -> None:
        """The beat thread."""
        ch, flags, steps, o = self.channels, self.flags, self.steps, self.o
        while not flags.closing.is_set():
            if steps.beat_now.wait(o.heartbeat_s):
                steps.beat_now.clear()
            if flags.closing.is_set():
                return
            st = steps.state
            if st is None or (o.parent_pid and process_stopped(o.parent_pid)):
                continue  # a stopped training process is not alive, whatever this side does
            if self.faults.cut():
                continue  # chaos: the link carries nothing
            try:
                reply = ch.control_stub.Heartbeat(
                    self.beat(st),
                    metadata=ch.metadata,
                    timeout=max(2.0, 4 * o.heartbeat_s),
                )
            except grpc.RpcError:
                continue
            if reply.stop:
                self.reporter(stop=True)
            elif reply.budget:
                self.reporter(budget=(st.tokens, reply.remaining, reply.live))
            if flags.connected.is_set() and (not reply.known or reply.epoch != self.session.epoch):
                ch.cancel_join()

    # -- the Pulls stream (pull schedule) -----------------------------------------------------
    def run_pulls(self) -> None:
        """The ctl thread: keeps the Pulls stream open while the schedule is "pull" and hands
        each pull to the training side (handled there at the next step boundary). The stream
        is read by this thread itself (single-threaded unary-stream channel option): no extra
        wake-ups."""
        ch, flags, session = self.channels, self.flags, self.session
        backoff = 0.2
        while not flags.closing.is_set():
            if session.schedule != "pull":
                flags.closing.wait(0.2)  # push: no Pulls stream (the schedule may change on rejoin)
                continue
            if not flags.connected.wait(0.2):
                continue
            joins = session.joins
            hello = convert.control_hello(self.id, self.o.incarnation)
            call = ch.control_stub.Pulls(hello, metadata=ch.metadata)
            ch.set_pulls(call)
            try:
                for msg in call:
                    if backoff > 0:  # the first message: the syncer registered the stream
                        backoff = 0.0
                        self.steps.beat_now.set()  # report our steps now: it can pull us
                    self.faults.wait_while_cut(flags.closing)
                    now = time.time()
                    for pull in convert.pulls_from_message(msg):
                        self.reporter.send(PullReceived(pull, now))
            except grpc.RpcError:
                pass
            finally:
                ch.set_pulls(None)
            if session.joins != joins:  # the Join stream reconnected meanwhile: reopen at once
                backoff = 0.2
                continue
            backoff = min(max(backoff, 0.1) * 2, 2.0)
            if flags.closing.wait(backoff * random.uniform(0.8, 1.2)):
                break
