"""A learner's communication with the syncer: gRPC streams, encoding, heartbeats, reconnects.

- side.py      `Comm`: the four threads below, composed; the training side's messages in
- session.py   what they share: the session (newest Welcome), step reports, flags
- part.py      what every thread is given (options, session, channels, flags, reports)
- channels.py  the bulk and control gRPC channels and their open calls
- status.py    messages and status reports to the training side
- sendqueue.py contributions waiting to go up, newest per fragment
- downlink.py  the Join stream: welcome, heal, updates (reassembled, crc-checked, decoded)
- uplink.py    encoding with error feedback, PushOne / Push, shaping
- control.py   heartbeats and the Pulls stream, on the control channel
- child.py     the child-process entry (`python -m atoll.live.comm.child`)
- messages.py  what the training side (atoll.live.learner) and this side say to each other
- framing.py   those messages over the child's socket pair

The learner imports this package, never the other way round.

By default it runs in a child process of the learner (at nice +10 so that its wake-ups do not
preempt the training thread; vectors pass through shared slots, atoll.live.shm, and it sends
no heartbeat while the training process is stopped); `Learner(comm="thread")` runs it in
threads of the learner's process. Reconnects use backoff 0.2 s doubling to 2 s with jitter.
"""

from __future__ import annotations

from atoll.live.comm.messages import CommOptions
from atoll.live.comm.side import Comm

__all__ = ["Comm", "CommOptions"]
