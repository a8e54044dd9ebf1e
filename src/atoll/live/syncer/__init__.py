"""The live syncer: a wall-clock, gRPC driver around atoll.core.syncer.SyncerProtocol.

Rooms: `handlers` (the RPCs), `runtime` (lock, timers, dispatch of the protocol's outputs,
accounting, background threads), `outbox` (what waits to go down to each learner), `store`
(tape and snapshots), `server` (the gRPC server and `SyncerService`).
"""

from atoll.live.syncer.runtime import SyncerOptions
from atoll.live.syncer.server import SyncerService

__all__ = ["SyncerOptions", "SyncerService"]
