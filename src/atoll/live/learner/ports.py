"""Where a learner's communication side runs: threads of this process, or a child process.

A port takes the training side's messages (`send`), hands back what the communication side
says (`get`, `get_all`), and moves vectors: `delta_buffer` (None, or a method: where the
protocol writes a contribution's delta, `LearnerProtocol.delta_out`), `submit` wraps a
contribution for the trip, `value_in` turns a received update's vector into a tensor (a copy,
or with `copy=False` possibly the memory it arrived in, until `done_with`).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import socket
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import torch

from atoll.core.messages import Outgoing
from atoll.live import shm
from atoll.live.comm.framing import FrameReader, write_frame
from atoll.live.comm.messages import (
    Close,
    CommFailed,
    CommOptions,
    FromComm,
    Start,
    StepState,
    Submit,
    ToComm,
    Vector,
)
from atoll.live.comm.shards import open_comm
from atoll.live.shm import SharedSlots

# the shared memory file is sized for 2 x 4 bytes per parameter (only the slots written take
# memory: atoll.live.shm); above this (2 GiB) vectors go in the messages
MAX_SLOT_VALUES = 1 << 28


class ThreadPort:
    """The communication side in threads of this process."""

    delta_buffer = None  # a delta is a new tensor, which the comm thread reads

    def __init__(self, opts: CommOptions) -> None:
        self.inbox: queue.SimpleQueue[FromComm] = queue.SimpleQueue()
        self.comm = open_comm(opts, self.inbox.put)
        self.comm.start()

    def send(self, msg: ToComm) -> None:
        self.comm.command(msg)

    def layout(self, numels: list[int]) -> None:
        pass

    def submit(self, o: Outgoing) -> Submit:
        if o.delta.device.type != "cpu":  # the comm thread encodes from host memory
            o = dataclasses.replace(o, delta=o.delta.cpu())
        return Submit(o)  # the comm thread reads the fresh delta tensor itself: no copy

    def value_in(self, p: int, value: Vector, copy: bool = True) -> torch.Tensor | None:
        assert value is None or isinstance(value, torch.Tensor)
        return value  # decoded for this learner alone: its own already

    def done_with(self, value: Vector) -> None:
        pass

    def get_all(self) -> list[FromComm]:
        out = []
        while (item := self.get(0.0)) is not None:
            out.append(item)
        return out

    def get(self, timeout: float) -> FromComm | None:
        try:
            if timeout <= 0:
                return self.inbox.get_nowait()
            return self.inbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def abort(self) -> None:
        """Before `close`, where nothing is left to send: nothing to do (threads end at once)."""

    def close(self) -> None:
        self.comm.close()


class ProcessPort:
    """The communication side in a child process (`python -m atoll.live.comm.child`, so the
    user's script is not imported again), over a socket pair read at step boundaries only
    (atoll.live.comm.framing). Vectors (contributions up, decoded updates down) go through
    shared slots (atoll.live.shm) when free, so that the messages themselves stay small."""

    def __init__(self, opts: CommOptions, total: int, nflags: int) -> None:
        self.slots: SharedSlots | None = None
        self._reserved: dict[int, int] = {}  # data_ptr -> up slot reserved for a delta
        fds, shm_args = [], []
        if shm.available() and 0 < total <= MAX_SLOT_VALUES:
            self.slots, fd = SharedSlots.create(total, nflags)
            fds, shm_args = [fd], [str(fd), str(total), str(nflags)]
        ours, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parents[3])  # the directory holding atoll/
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "atoll.live.comm.child", str(theirs.fileno()), *shm_args],
            pass_fds=[theirs.fileno(), *fds],
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        for fd in fds:
            os.close(fd)  # the mapping stays
        self.sock = ours
        self.reader = FrameReader(ours)
        self._ready: deque[FromComm] = deque()  # parsed, not yet handed out (by `get`)
        self.dead = False
        self.send(Start(opts))

    def send(self, msg: ToComm) -> None:
        if self._reserved and isinstance(msg, StepState):  # its submits are in: none is left
            self._reserved.clear()
            if self.slots is not None:
                self.slots.release(self.slots.up)
        if self.dead:
            return
        try:
            write_frame(self.sock, msg)
        except OSError:  # BrokenPipeError included: the child is gone
            self.dead = True

    def layout(self, numels: list[int]) -> None:
        if self.slots is not None and not self.slots.layout(numels):
            self.slots = None

    def delta_buffer(self, p: int) -> torch.Tensor | None:
        """A free up slot for fragment p's delta (the protocol writes it there: no copy at
        `submit`), or None."""
        got = None if self.slots is None else self.slots.reserve(self.slots.up, p)
        if got is None:
            return None
        self._reserved[got[1].data_ptr()] = got[0]
        return got[1]

    def submit(self, o: Outgoing) -> Submit:
        if self.slots is not None:
            slot = self._reserved.pop(o.delta.data_ptr(), None)  # written in place
            if slot is not None:
                self.slots.commit(self.slots.up, slot)
            else:
                slot = self.slots.put(self.slots.up, o.fragment, o.delta)
            if slot is not None:
                return Submit(o, slot)
        return Submit(o, o.delta.cpu().numpy())

    def value_in(self, p: int, value: Vector, copy: bool = True) -> torch.Tensor | None:
        """The vector as a tensor; with `copy=False` one in a slot is read in place and the
        slot stays busy until `done_with`."""
        if isinstance(value, int):
            assert self.slots is not None, "a vector in a slot, but no slots"
            if copy:
                return self.slots.take(self.slots.down, value, p)
            return self.slots.view(self.slots.down, value, p)
        if value is None or isinstance(value, torch.Tensor):
            return value
        return torch.from_numpy(value)

    def done_with(self, value: Vector) -> None:
        """A vector read in place (`value_in(copy=False)`) is no longer needed."""
        if isinstance(value, int) and self.slots is not None:
            self.slots.free(self.slots.down, value)

    def get_all(self) -> list[FromComm]:
        """Everything waiting now, with one read of the socket (then a `CommFailed` once, if
        the child is gone)."""
        out = list(self._ready)
        self._ready.clear()
        if self.dead:
            return out
        out.extend(self.reader.read())  # type: ignore[arg-type]  # only FromComm comes up
        if self.reader.closed:
            self.dead = True
            out.append(CommFailed("the communication process ended"))
        return out

    def get(self, timeout: float) -> FromComm | None:
        """The next item, waiting up to `timeout` seconds for one."""
        until = time.monotonic() + timeout
        while not self._ready:
            self._ready.extend(self.get_all())
            if self._ready or self.dead:
                break
            left = until - time.monotonic()
            if left <= 0:
                break
            self._ready.extend(self.reader.read(left))  # type: ignore[arg-type]
        return self._ready.popleft() if self._ready else None

    def abort(self) -> None:
        """Before `close`, where nothing is left to send (a start that failed): the child is
        ended at once, not waited for (it may still be importing torch)."""
        self.dead = True
        if self.proc.poll() is None:
            self.proc.terminate()

    def close(self) -> None:
        self.send(Close())
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(2.0)
        self.sock.close()


class ClosedPort:
    """The port of a closed learner: sends nothing, receives nothing."""

    def send(self, msg: ToComm) -> None:
        pass

    def submit(self, o: Outgoing) -> Submit:
        return Submit(o)

    def get(self, timeout: float) -> FromComm | None:
        return None

    def get_all(self) -> list[FromComm]:
        return []

    def close(self) -> None:
        pass


Port = ThreadPort | ProcessPort | ClosedPort  # what the training side talks through
