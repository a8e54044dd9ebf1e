"""Helpers shared by tests of more than one module (plain functions and constants; the
fixtures built on them are in conftest.py)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from atoll.config import SimConfig
from atoll.core import codec
from atoll.core.fragments import make_plan
from atoll.core.learner import LearnerConfig, LearnerProtocol
from atoll.core.messages import Outgoing, Send
from atoll.core.syncer import SyncerConfig, SyncerProtocol

# -- the learner and syncer state machines, driven by hand with explicit times ------------------
SHAPES = {"a": (4,), "b": (3,)}


def setup(
    quorum=1, grace=False, n=2, receipt="overwrite", codec_name="fp32", tau=1, schedule="push", **kw
):
    plan = make_plan(SHAPES, P=2, H=2)
    init = {k: torch.zeros(s) for k, s in SHAPES.items()}
    syncer = SyncerProtocol(
        plan,
        [plan.flatten(init, p) for p in range(2)],
        SyncerConfig(
            **{
                "quorum": quorum,
                "grace": grace,
                "tau": tau,
                "outer": "sgd",
                "outer_lr": 1.0,
                "schedule": schedule,
                **kw,
            }  # fmt: skip
        ),
    )
    learners = []
    for i in range(n):
        params = {k: torch.zeros(s) for k, s in SHAPES.items()}
        lp = LearnerProtocol(
            f"L{i}",
            plan,
            params,
            LearnerConfig(tau=tau, codec=codec_name, receipt=receipt, schedule=schedule),
        )
        heal = [o for o in syncer.on_join(0.0, lp.id) if isinstance(o, Send)][0].message
        lp.on_heal(0.0, heal)
        learners.append(lp)
    return plan, syncer, learners


_ENCODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def encoded(lp, outputs):
    """A driver's part: the learner's `Outgoing` deltas encoded, in send order, by its own
    encoder (error feedback included)."""
    cfg = lp.cfg
    enc = _ENCODERS.setdefault(
        lp, codec.ContributionEncoder(cfg.codec, cfg.group, cfg.error_feedback)
    )
    return [
        Send(o.to, enc.encode(o.message)) if isinstance(o.message, Outgoing) else o for o in outputs
    ]


def step(lp, now, tokens, step_time):
    return encoded(lp, lp.on_step(now, tokens, step_time))


def sends(outputs):
    return [o for o in outputs if isinstance(o, Send)]


# -- a small run for the syncer core and the syncer service in process --------------------------
CFG = SimConfig(
    learners=2, P=3, H=3, tau=1, quorum=2, grace=False, codec="int4", schedule="pull",
    n_layer=1, d_model=8, n_head=2, context=8, batch=2, data_bytes=200_000, eval_batches=1,
)  # fmt: skip
SECRET, RUN = "secret-0123456789", "run-r"


def syncer_in_process(tmp_path: Path) -> Iterator[tuple[Any, Any, list[int], Path]]:
    """The live syncer service of CFG, in this process on a loopback port, its fatal exits
    recorded instead of taken. Yields (service, stub, exit codes, run directory)."""
    from atoll.live.syncer import SyncerOptions, SyncerService
    from atoll.model.recipe import builtin_plan
    from atoll.wire import atoll_pb2_grpc as pbg
    from atoll.wire.auth import open_channel

    plan, init = builtin_plan(CFG)
    kw = dict(lost_after_s=1.0, snapshot_every_s=0.2, token_budget=10_000, max_learners=6)
    known = SyncerOptions.__dataclass_fields__  # (the same test runs against older code)
    opts = SyncerOptions(tmp_path, RUN, SECRET, **{k: v for k, v in kw.items() if k in known})
    service = SyncerService(plan, init, CFG.syncer_config(), CFG.learner_config(), opts)
    died: list[int] = []

    def exit_(code: int) -> None:
        died.append(code)

    service.runtime.exit = exit_
    port = service.start()
    ch = open_channel(f"127.0.0.1:{port}", "control", None)
    yield service, pbg.SyncerStub(ch), died, tmp_path
    ch.close()
    service.stop(final_dir=tmp_path)


# -- a syncer process (e2e tests) ---------------------------------------------------------------
def started_address(proc, run_dir: Path, timeout: float) -> str:
    """The address the `atoll syncer` process `proc` writes in `run_dir` once it listens; if it
    ends or `timeout` seconds pass first, it is killed and the test fails with its output."""
    from atoll.live.client import syncer_address

    addr = syncer_address(run_dir, timeout, alive=lambda: proc.poll() is None)
    if addr is None:
        proc.kill()
        out = proc.communicate()[0] or b""  # None: its output was not piped
        raise AssertionError(f"the syncer did not start: {out.decode()[-2000:]}")
    return addr


def syncer_process(run_dir: Path, argv: list[str], env: dict, cwd: Path | None = None) -> tuple:
    """`atoll syncer --run-dir run_dir *argv` as a process, once it serves (its secret from
    `env`'s ATOLL_SECRET, the run id RUN unless argv names one). Returns (process, address)."""
    import subprocess
    import sys

    from atoll.live.client import wait_ready

    cmd = [sys.executable, "-m", "atoll.cli", "syncer", "--run-dir", str(run_dir), *argv]
    if "--run-id" not in argv:
        cmd += ["--run-id", RUN]
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    addr = started_address(proc, run_dir, 60)
    wait_ready(addr, argv[argv.index("--run-id") + 1] if "--run-id" in argv else RUN,
               env["ATOLL_SECRET"], 20)  # fmt: skip
    return proc, addr


def learner_process(
    addr: str, index: int, run_dir: Path, sets: list[str], env: dict, cwd: Path | None = None
) -> Any:
    """`atoll learner *sets --index index` as a process, to the syncer at `addr` (run id RUN),
    logging its events to run_dir/events.jsonl and its output to run_dir/L{index}.log."""
    import subprocess
    import sys

    events = str(run_dir / "events.jsonl")
    cmd = [sys.executable, "-m", "atoll.cli", "learner", *sets, "--syncer", addr,
           "--index", str(index), "--run-id", RUN, "--events", events]  # fmt: skip
    log = open(run_dir / f"L{index}.log", "wb")  # noqa: SIM115 - the process writes it
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
