"""The communication side as a child process of the learner (`Learner(comm="process")`):

    python -m atoll.live.comm.child FD [SHM_FD TOTAL NFLAGS]

FD is its end of the socket pair (atoll.live.comm.framing both ways); the first message is
`Start` (the options). SHM_FD, TOTAL, NFLAGS name the shared slots (atoll.live.shm) through
which vectors move when free. It dies with the learner (PR_SET_PDEATHSIG), ignores Ctrl+C (the
learner closes it), runs at added niceness and sends no heartbeat while the learner is stopped.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import socket
import sys
import threading
from collections import deque

import torch

from atoll.live.comm.framing import FrameReader, write_frame
from atoll.live.comm.messages import (
    FromComm,
    Start,
    StepState,
    ToComm,
    UpdateReceived,
    Welcomed,
)
from atoll.live.comm.shards import ShardedComm, open_comm
from atoll.live.comm.side import Comm
from atoll.live.shm import SharedSlots


class _Outbox:
    """Up messages to the learner, from any thread, in order. Whichever thread finds the
    writer free sends everything queued; a thread that finds it busy (a training process slow
    to read: a long step, a stop) leaves its message to the writing thread and goes on:
    heartbeats never wait on the socket. No thread of its own: one wake-up less per message."""

    def __init__(self, sock: socket.socket, slots: SharedSlots | None) -> None:
        self.sock = sock
        self.slots = slots
        self.comm: Comm | ShardedComm | None = None
        self._queue: deque[FromComm] = deque()
        self._writing = threading.Lock()

    def __call__(self, item: FromComm) -> None:
        self._queue.append(item)
        while self._queue and self._writing.acquire(blocking=False):
            try:
                while self._queue:
                    self._send(self._queue.popleft())
            finally:
                self._writing.release()

    def _send(self, item: FromComm) -> None:
        slots = self.slots
        if isinstance(item, Welcomed) and slots is not None and self.comm is not None:
            slots.layout(self.comm.fragment_sizes())  # the fragment sizes, plan order
        elif isinstance(item, UpdateReceived) and isinstance(item.value, torch.Tensor):
            u, value = item.update, item.value
            slot = None if slots is None else slots.put(slots.down, u.fragment, value)
            # in a slot, or as numpy (pickles plainly; torch would not)
            item = UpdateReceived(u, value.numpy() if slot is None else slot)
        try:
            write_frame(self.sock, item)
        except OSError:
            pass


def _take_vectors(st: StepState, slots: SharedSlots | None) -> StepState:
    """The step's contributions with their vectors in place (out of their slots now)."""
    if not st.submits:
        return st
    out = []
    for s in st.submits:
        if isinstance(s.vector, int):
            assert slots is not None, "a vector in a slot, but no slots"
            out.append(s.with_delta(slots.take(slots.up, s.vector, s.outgoing.fragment)))
        elif s.vector is not None:
            out.append(s.with_delta(torch.from_numpy(s.vector)))  # type: ignore[arg-type]
        else:
            out.append(s)
    return dataclasses.replace(st, submits=tuple(out))


def comm_main(
    reader: FrameReader, start: Start, slots: SharedSlots | None = None, pending: list | None = None
) -> None:
    """Run a `Comm` with the training side's messages from `reader` (`pending`: read already),
    its own back over the same socket."""
    try:  # die with the learner process, even when it is SIGKILLed
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C goes to the learner; it closes us
    opts = start.options
    if opts.nice:
        os.nice(opts.nice)
    torch.set_num_threads(1)
    outbox = _Outbox(reader.sock, slots)
    comm = open_comm(dataclasses.replace(opts, parent_pid=os.getppid()), outbox)
    outbox.comm = comm
    comm.start()
    msgs = pending or []
    try:
        while msgs or not reader.closed:  # closed: the learner process is gone
            for msg in msgs:
                if isinstance(msg, StepState):
                    msg = _take_vectors(msg, slots)
                if not comm.command(msg):  # type: ignore[arg-type]  # only ToComm comes down
                    return
            msgs = reader.read(wait=None)
    finally:
        comm.close()


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    slots = None
    if len(argv) > 3:
        slots = SharedSlots(int(argv[1]), int(argv[2]), int(argv[3]))
    reader = FrameReader(sock)
    first: list[ToComm] = []
    while not first and not reader.closed:
        first = reader.read(wait=None)  # type: ignore[assignment]
    if first and isinstance(first[0], Start):
        comm_main(reader, first[0], slots, first[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
