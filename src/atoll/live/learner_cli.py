"""`atoll learner`: one learner training the built-in model, synced over gRPC: one process,
or an island of ranks under torchrun (`--nproc`, or the `island_size` setting; DDP inside,
rank 0 talks to the syncer: atoll.live.learner.island)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from pathlib import Path

from atoll.errors import ConfigError
from atoll.live.common import add_auth_arguments, add_config_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    add_auth_arguments(p)
    p.add_argument(
        "--syncer",
        required=True,
        help="the syncer's address, host:port (a sharded syncer: every shard's, in shard "
        "order, comma-separated)",
    )
    p.add_argument("--id", default=None, help="learner id (default L<index>)")
    p.add_argument("--index", type=int, default=0, help="data shard index in [0, learners)")
    p.add_argument("--restart", type=int, default=0, help="restart count (reseeds the data)")
    p.add_argument("--events", type=Path, help="append events to this events.jsonl")
    p.add_argument("--tls-ca", help="PEM root certificate to check the syncer's TLS certificate")
    p.add_argument(
        "--corpus",
        type=Path,
        help="the text corpus's bytes, cached by the launcher (not for token files)",
    )
    p.add_argument("--faults", type=Path, help="chaos: the link-fault file the launcher writes")
    p.add_argument(
        "--standby",
        type=Path,
        help="a warm spare: import everything, then wait until this file holds the restart count",
    )
    p.add_argument(
        "--max-steps", type=int, default=0, help="stop after this many local steps (0: budget)"
    )
    isl = p.add_argument_group("islands (torchrun)")
    isl.add_argument(
        "--nproc", type=int, help="ranks of this island on this host (default: island_size)"
    )
    isl.add_argument("--nnodes", type=int, default=1, help="hosts of this island")
    isl.add_argument(
        "--node-rank", type=int, default=0, help="this host's rank in [0, nnodes) (torchrun)"
    )
    isl.add_argument(
        "--rdzv-endpoint",
        default="",
        help="with --nnodes > 1: host:port of the c10d rendezvous, on the node of --node-rank 0",
    )
    isl.add_argument(
        "--local-addr",
        default="",
        help="with --nnodes > 1: this host's address for the island's ranks (default: what its "
        "host name resolves to)",
    )
    isl.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="torchrun restarts the island's ranks in place, and `atoll island` restarts "
        "torchrun itself, at most this many times each",
    )


def _torchrun(args: argparse.Namespace, nproc: int, learner_id: str) -> int:
    """Run this same command as an island: torchrun, which starts `nproc` ranks of it here
    (each finds itself under torchrun and trains). Without restarts it replaces this process
    (same pid); with `--max-restarts` it runs under the island's supervisor (`atoll island`),
    and its exit code is returned."""
    from atoll.live.island_cli import island_env, supervise

    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise ConfigError("--rdzv-endpoint", "''", "host:port of the rendezvous when --nnodes > 1")
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    argv += [f"--nnodes={args.nnodes}", f"--max-restarts={args.max_restarts}"]
    if args.nnodes > 1:
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={args.rdzv_endpoint}"]
        argv += [f"--rdzv-id={args.run_id}-{learner_id}", f"--node-rank={args.node_rank}"]
        # node 0 hosts the rendezvous store (torchrun's own guess, by host name, fails where
        # the endpoint is an address of a second interface or of a container)
        argv += [f"--rdzv-conf=is_host={int(args.node_rank == 0)}"]
        argv += [f"--local-addr={args.local_addr}"] if args.local_addr else []
    else:
        argv += ["--standalone"]
    sys.stdout.flush()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # a store per rendezvous round: torchrun's restarts in place do not hang (island_cli)
    os.environ.update(island_env({}))
    # after "--": torchrun's parser would otherwise read this command's options as its own
    command = [*argv, "-m", "atoll.cli", "--", *args._argv]
    if args.max_restarts > 0:
        return supervise(command, args.max_restarts)
    os.execv(sys.executable, command)
    return 1  # not reached


def _join_island(nproc: int, nnodes: int, device: object) -> int:
    """A rank under torchrun on `device`: joins the island's process group (NCCL on a GPU,
    gloo on the CPU: the backend follows the model's device); its rank."""
    import signal
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from atoll.live.common import die_with_parent
    from atoll.live.learner.devices import backend_for

    die_with_parent(signal.SIGKILL)  # a rank does not outlive its torchrun agent
    world = int(os.environ["WORLD_SIZE"])
    if world != nproc * nnodes:
        raise ConfigError("WORLD_SIZE", world, f"--nproc x --nnodes = {nproc * nnodes}")
    assert isinstance(device, torch.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # a syncer away longer than this fails the island's collectives (it then restarts)
    dist.init_process_group(backend_for(device), timeout=timedelta(minutes=30))
    return dist.get_rank()


def main(args: argparse.Namespace) -> int:
    import signal
    import time

    from atoll.live.address import check_addresses
    from atoll.live.client import check_secret
    from atoll.wire.auth import load_secret

    # a bad address, or a secret or run id the syncer refuses, is said in one line at once,
    # before torch and the data are loaded (seconds on a busy host); no secret at all is said
    # once the data are checked
    check_addresses(args.syncer, "--syncer")
    with contextlib.suppress(ConfigError):
        secret = load_secret(args.secret_file)
        check_secret(f"learner {args.id or f'L{args.index}'}", args.syncer, args.run_id, secret,
                     args.tls_ca)  # fmt: skip

    from atoll.config import load_job

    job = load_job(args.overrides, args.config)  # a bad setting too: before torch
    scfg, lcfg = job.sim, job.live
    if not 0 <= args.index < scfg.learners:
        raise ConfigError("--index", args.index, f"an integer in [0, learners={scfg.learners})")
    import torch

    from atoll.config.options import learner_options
    from atoll.live.learner import Learner, LearnerOptions
    from atoll.live.learner.devices import learner_device
    from atoll.model.recipe import load_corpus, new_model
    from atoll.model.train import DataStream, inner_lr, new_inner_optimizer, train_step

    torch.set_num_threads(1)
    # bad data (a missing file, ids beyond vocab, too few tokens) stops here, before the syncer
    # is asked anything; text the launcher read once comes from its cache file
    cached = args.corpus.read_bytes() if args.corpus and args.corpus.is_file() else None
    corpus = load_corpus(scfg, cached)
    lid = args.id or f"L{args.index}"
    nproc = args.nproc or lcfg.island_sizes(scfg.learners)[args.index]
    if nproc < 1 or args.nnodes < 1:
        raise ConfigError("--nproc/--nnodes", f"{nproc}/{args.nnodes}", "integers >= 1")
    if not 0 <= args.node_rank < args.nnodes:
        raise ConfigError("--node-rank", args.node_rank, f"an integer in [0, {args.nnodes})")
    # `batch` is the learner's: an island's ranks split it (each trains batch / ranks), so an
    # island is a faster learner of the same recipe (same steps, schedule and budget)
    ranks = nproc * args.nnodes
    if scfg.batch % ranks:
        raise ConfigError("batch", scfg.batch, f"a multiple of the island's {ranks} ranks")
    under_torchrun = "LOCAL_RANK" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ
    # the model, its batches and the island's backend on one device: cuda:LOCAL_RANK when the
    # host has a GPU per rank (`device` auto), else the CPU; too few GPUs stop here, at once
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if under_torchrun else 0
    device = learner_device(lcfg.device, local_rank, nproc)
    if nproc * args.nnodes > 1 and not under_torchrun:
        return _torchrun(args, nproc, lid)
    if under_torchrun:  # a restarted island resumes the schedule and draws other batches
        from atoll.live.island_cli import restarts_so_far

        args.restart += restarts_so_far()
    rank = _join_island(nproc, args.nnodes, device) if under_torchrun else 0
    slowdown = scfg.speed_factors()[args.index]
    stop = {"now": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    model = new_model(scfg).to(device)  # overwritten by the heal: the syncer's values are used
    opt = new_inner_optimizer(model, scfg)
    step_model: torch.nn.Module = model
    if under_torchrun:  # the island's ranks average their gradients every step
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        step_model = DistributedDataParallel(model, device_ids=ids)
    data = DataStream(dataclasses.replace(scfg, batch=scfg.batch // ranks), corpus, args.index)
    if args.standby is not None:  # a warm spare: everything is loaded; wait to be needed
        x, y = (t.to(device) for t in data.next())
        # torch's first forward and backward, on a throwaway on the learner's device
        new_model(scfg).to(device)(x, y).backward()
        while not args.standby.exists():
            if stop["now"]:
                return 130
            time.sleep(0.02)
        args.restart = int(args.standby.read_text())
    # each restart, and each rank of an island, draws its own batches from the learner's shard
    data.gen.manual_seed(scfg.seed * 1000 + args.index + 7919 * args.restart + 104729 * rank)
    opts = LearnerOptions(
        learner_id=lid,
        run_id=args.run_id,
        secret_file=args.secret_file,
        tls_ca=args.tls_ca,
        events=str(args.events) if args.events else None,
        # this process is ours alone: with comm threads, a 0.2 ms GIL switch interval bounds
        # the training thread's wait after each torch op (the library's opt-in, docs/live.md)
        switch_interval_s=2e-4,
        faults_file=str(args.faults) if args.faults else None,
        **learner_options(job, args.index),  # wait_s, shape_mbps, heartbeat_s, timeout, comm
    )
    learner = Learner(model, opt, args.syncer, opts)
    start = time.time()
    if lcfg.start_barrier and args.restart == 0 and rank == 0:
        start = _start_time(args, learner, stop)
    limit = args.max_steps or 4 * -(-scfg.budget_tokens() // (scfg.batch * scfg.context))
    period = lcfg.pace_s * slowdown
    local = 0
    # a restarted learner goes on with the run's learning-rate schedule, where the run is
    # (its average learner's step), not from the warmup again: with a learner killed every
    # minute, restarted schedules cost 11% of eval loss in a 14-minute soak
    offset = _run_steps(args, scfg) if args.restart > 0 else 0
    while not stop["now"] and not learner.should_stop and local < limit:
        t0 = time.perf_counter()
        batch = tuple(t.to(device, non_blocking=True) for t in data.next())
        train_step(step_model, opt, batch, inner_lr(scfg, offset + local))
        local += 1
        if period > 0:  # paced: step k ends on the grid start + k*period
            time.sleep(max(start + local * period - time.time(), 0.0))
        elif slowdown > 1:
            time.sleep((slowdown - 1) * (time.perf_counter() - t0))
        learner.step(tokens=batch[0].numel())
    if stop["now"]:
        learner.close()
        return 130
    learner.finish()
    if under_torchrun:  # the DDP wrapper first (it holds the process group), then the group
        import torch.distributed as dist

        dist.barrier()  # every rank done with the group's collectives before any rank leaves
        del step_model
        dist.destroy_process_group()
        # everything is reported and closed; torch's C++ threads can still abort the process
        # while the interpreter tears down on a busy host ("terminate called without an active
        # exception", a non-zero exit for a run that ended well): leave without the teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _run_steps(args: argparse.Namespace, scfg: object) -> int:
    """The run's progress in steps of one learner of one process: tokens trained so far (the
    syncer's count) over every learner's tokens per step; 0 if the syncer does not answer."""
    from atoll.live.client import status
    from atoll.wire.auth import load_secret

    try:
        secret = load_secret(args.secret_file)
        st = status(args.syncer, args.run_id, secret, 2.0, args.tls_ca)
    except Exception:  # noqa: BLE001 - the syncer may be restarting: start the schedule over
        return 0
    return int(st.tokens // max(scfg.learners * scfg.batch * scfg.context, 1))


def _start_time(args: argparse.Namespace, learner: object, stop: dict) -> float:
    """Wait (at most 60 s) for the syncer's start time, when all expected learners have
    joined; the time this learner's paced grid starts (now, if that time has passed)."""
    import time

    from atoll.live.client import status
    from atoll.wire.auth import load_secret

    secret = load_secret(args.secret_file)  # (the Learner has read it already: it exists)
    until = time.time() + 60.0
    while time.time() < until and not stop["now"]:
        try:
            st = status(args.syncer, args.run_id, secret, 1.0, args.tls_ca)
        except Exception:  # noqa: BLE001 - the syncer may be restarting; keep waiting
            st = None
        if st is not None and st.start_at > 0:
            # a learner added after the start paces from its own start: on the run's grid
            # it would train unpaced until it caught up (a chaos `add` 13 s late ran 260
            # steps at full speed and finished while the syncer was down); the others
            # share the grid exactly
            late = st.start_at < time.time()
            time.sleep(max(st.start_at - time.time(), 0.0))
            learner._last_step_t = time.time()
            return learner._last_step_t if late else st.start_at
        time.sleep(0.05)
    return time.time()
