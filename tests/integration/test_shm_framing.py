"""Messages between a learner and its communication process: pickled, framed over a socket
pair by a writer thread, their vectors in shared slots (atoll.live.comm.framing,
atoll.live.shm)."""

import os

import torch

from atoll.live.shm import SharedSlots


def test_framed_messages_round_trip_and_contributions_travel_without_tensors():
    import pickle
    import socket
    import threading

    from atoll.core.messages import Outgoing, Resume
    from atoll.live.comm.child import _take_vectors
    from atoll.live.comm.framing import FrameReader, write_frame
    from atoll.live.comm.messages import Reset, StepState, Submit

    delta = torch.arange(6.0)
    o = Outgoing("L0", 1, 7, 3, 2, 64, 1.5, 0.1, 0.2, 1, delta)
    sub = Submit(o)  # thread mode; pickled (process mode), the delta goes as a numpy array
    assert b"torch" not in pickle.dumps(sub)
    back = pickle.loads(pickle.dumps(sub))
    assert back.outgoing.seq == 7 and back.outgoing.delta.numel() == 0
    st = StepState(2, 64, 0.2, 0.1, Resume((3, 3), (3, 4)), (back,))
    took = _take_vectors(st, None).submits[0]
    assert took.vector is None and torch.equal(took.outgoing.delta, delta)
    slots, fd = SharedSlots.create(total=10, nflags=2)
    other = SharedSlots(fd, 10, 2)
    os.close(fd)
    assert slots.layout([4, 6]) and other.layout([4, 6])
    assert slots.put(slots.up, 1, delta) == 0
    st = StepState(2, 64, 0.2, 0.1, Resume((3, 3), (3, 4)), (Submit(o, 0),))
    took = _take_vectors(pickle.loads(pickle.dumps(st)), other).submits[0]
    assert torch.equal(took.outgoing.delta, delta) and slots.put(slots.up, 1, delta) == 0  # freed

    class Counting:
        def __init__(self) -> None:
            self.calls = 0

        def sendall(self, data: bytes) -> None:
            self.calls += 1

    small = Counting()
    write_frame(small, st)
    assert small.calls == 1  # one sendall for a small message

    ours, theirs = socket.socketpair()
    msgs = [Reset(1), ("big", b"x" * 70_000), ("bigger", torch.arange(300_000.0).numpy()), st]
    writer = threading.Thread(target=lambda: [write_frame(ours, m) for m in msgs])
    writer.start()
    reader = FrameReader(theirs, chunk_bytes=4096)
    got: list = []
    while len(got) < len(msgs):
        got.extend(reader.read(wait=5.0))
    writer.join(10)
    assert got[0] == msgs[0] and got[1] == msgs[1]
    assert got[2][0] == "bigger" and (got[2][1] == msgs[2][1]).all()
    assert got[3].submits[0].vector == 0 and reader.read() == []
    ours.close()
    assert reader.read(wait=1.0) == [] and reader.closed  # the peer is gone
