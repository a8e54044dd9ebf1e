"""The live processes' options, each built from the one `JobConfig` (never copied by hand):

- `syncer_options(job, ...)`   the syncer service's `SyncerOptions` (`atoll syncer`)
- `learner_options(job, ...)`  the built-in learner's `LearnerOptions` fields that
                               come from the settings (`atoll learner`); the learner builds its
                               communication side's `CommOptions` from them
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from atoll.config.job import JobConfig
from atoll.core.shards import ShardSpec


@dataclass
class SyncerOptions:
    run_dir: Path
    run_id: str
    secret: str
    host: str = "127.0.0.1"
    port: int = 0
    chunk_bytes: int = 256 * 1024
    lost_after_s: float = 3.0
    finish_window_s: float = 30.0
    snapshot_every_s: float = 10.0
    snapshot_history: int = 8
    tape_fsync: bool = False
    token_budget: int = 0  # 0: no budget (run until stopped)
    tls_cert: str | None = None
    tls_key: str | None = None
    max_fragment_bytes: int = 0  # 0: derived from the plan
    expect_learners: int = 0  # start_at is set once this many learners have joined
    max_learners: int = 100  # live sessions (and Pulls streams) at most: 2 threads each
    shard: ShardSpec = ShardSpec()  # which shard of the syncer this is (core/shards.py)


def syncer_options(
    job: JobConfig,
    run_dir: Path,
    run_id: str,
    secret: str,
    *,
    budget: bool = True,
    expect: int | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    shard: ShardSpec | None = None,
) -> SyncerOptions:
    """The syncer service's options: `budget` False runs until stopped; `expect`: learners
    that start together (None: all the job's learners)."""
    live = job.live
    return SyncerOptions(
        run_dir=run_dir,
        run_id=run_id,
        secret=secret,
        host=live.host,
        port=live.port,
        chunk_bytes=live.chunk_bytes,
        lost_after_s=live.lost_after_s,
        finish_window_s=live.finish_window_s,
        snapshot_every_s=live.snapshot_every_s,
        snapshot_history=live.snapshot_history,
        tape_fsync=live.tape_fsync,
        # every shard counts the budget (its run ends by it); learners take the home shard's
        # (0) stop and remaining tokens (core/shards.py)
        token_budget=job.sim.budget_tokens() if budget else 0,
        tls_cert=tls_cert,
        tls_key=tls_key,
        expect_learners=job.run.learners if expect is None else expect,
        max_learners=live.max_learners,
        shard=shard or ShardSpec(),
    )


def learner_options(job: JobConfig, index: int) -> dict[str, object]:
    """The settings' `LearnerOptions` fields of learner `index`: its answer wait,
    upload limit, heartbeat, join timeout and communication mode (`auto` decided for one
    learner process: `atoll run` passes the mode it chose for all of them)."""
    from atoll.live.comm_mode import resolve_comm

    live = job.live
    return {
        "wait_s": live.wait_s,
        "shape_mbps": live.shape_factors(job.run.learners)[index],
        "heartbeat_s": live.heartbeat_s,
        "connect_timeout_s": live.join_timeout_s,
        "comm": resolve_comm(live.comm, 1),
    }
