"""`atoll syncer`: the syncer service of a live run (gRPC), durable in --run-dir."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.live.common import add_auth_arguments, add_config_arguments

if TYPE_CHECKING:
    import torch

    from atoll.config import SimConfig
    from atoll.core.fragments import FragmentPlan
    from atoll.core.shards import ShardSpec
    from atoll.eventlog import EventLog
    from atoll.live.syncer import SyncerService
    from atoll.live.syncer.endpoints import HttpEndpoints
    from atoll.live.syncer.evaluation import Evaluate, LiveEvaluation
    from atoll.live.view import RunView


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    add_auth_arguments(p)
    p.add_argument("--run-dir", type=Path, required=True, help="tape, snapshots, events, results")
    p.add_argument("--tls-cert", help="PEM certificate (TLS; with --tls-key)")
    p.add_argument("--tls-key", help="PEM private key (TLS; with --tls-cert)")
    p.add_argument(
        "--init",
        help="safetensors file of a custom model's initial parameters, written by "
        "atoll.save_init (default: the built-in model from the settings' seed)",
    )
    p.add_argument(
        "--init-from",
        metavar="MODULE:FUNCTION",
        help="a function returning the custom model (imported with the current directory on "
        "the path, e.g. examples.hf_causal_lm:build_model): its parameters are the initial ones",
    )
    p.add_argument(
        "--embeddings",
        default=None,
        help="with --init or --init-from: comma-separated embedding tensor names ('' for none; "
        "default: those the model's embedding modules hold, as atoll.save_init stored them)",
    )
    p.add_argument("--no-budget", action="store_true", help="run until stopped (no token budget)")
    p.add_argument(
        "--serve-after-budget",
        action="store_true",
        help="once the budget's run is over, write the results and serve on until stopped "
        "(default: write them and exit 0)",
    )
    p.add_argument("--launched", action="store_true", help=argparse.SUPPRESS)  # by atoll run
    p.add_argument(
        "--shards",
        type=int,
        default=None,
        help="start this many shard processes, each serving its share of the fragments, in "
        "RUN_DIR/shard-i (default: the shards setting, 1); learners take all their addresses",
    )
    p.add_argument(
        "--shard",
        metavar="I/S",
        help="run shard I of S only (one per host; each with its own --run-dir)",
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=0,
        help="serve the status page (/), /metrics (Prometheus), /healthz and /status.json on "
        "this port (default 0: off); with --shards S, the whole set's on HTTP_PORT and "
        "shard i's own on HTTP_PORT+1+i",
    )
    p.add_argument(
        "--http-host",
        default="127.0.0.1",
        help="the address the HTTP endpoints bind (default loopback; 0.0.0.0 for every one)",
    )
    p.add_argument("--events", type=Path, help="event log (default: RUN_DIR/events.jsonl)")
    p.add_argument(
        "--eval-from",
        metavar="MODULE:FUNCTION",
        help="a function returning a custom model's evaluation, callable(params by name) -> "
        "held-out loss, called on the global model while the run goes (the built-in model is "
        "evaluated without it; the eval setting false: never)",
    )
    p.add_argument("--eval-parts", action="store_true", help=argparse.SUPPRESS)  # set's shards
    p.add_argument(
        "--view",
        choices=("auto", "off"),
        default="auto",
        help="auto (default): the run live on a terminal, a plain line every few seconds when "
        "stdout is not one; off: neither",
    )
    p.add_argument(
        "--expect", type=int, default=-1, help="learners that start together (default: learners)"
    )


def main(args: argparse.Namespace) -> int:
    import signal
    import sys
    import threading
    import time

    from atoll.config import load_job
    from atoll.wire.auth import load_secret

    job = load_job(args.overrides, args.config)  # a bad setting or secret: before torch
    scfg = job.sim
    secret = load_secret(args.secret_file)
    from atoll.config.options import syncer_options
    from atoll.core.events import RestoreFailed
    from atoll.core.shards import ShardSpec, identity
    from atoll.errors import EXIT_STORE, restore_hint
    from atoll.eventlog import EventLog
    from atoll.live.client import write_address
    from atoll.live.syncer import SyncerService, results, shard_set
    from atoll.live.syncer.store_read import StoreError

    plan, init = _start(args, scfg)  # bad input stops here, before anything is written
    shard = ShardSpec.parse(args.shard) if args.shard else None
    count = args.shards if args.shards is not None else job.live.shards
    (shard or ShardSpec(0, count)).check(plan.P)
    run_dir: Path = args.run_dir
    if args.serve_after_budget and args.no_budget:
        print("atoll syncer: warning: --serve-after-budget without a budget (--no-budget): "
              "it serves until stopped anyway", file=sys.stderr, flush=True)  # fmt: skip
    if shard is None and count > 1:  # the whole shard set, as child processes
        del init
        view = _set_view(args, job, plan, args.events or run_dir / "events.jsonl")
        return shard_set.run(args, job, count, evaluate_for(args, job), view)
    if shard is not None:
        shard_set.claim(run_dir, identity(plan, shard, args.run_id))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "syncer.addr").unlink(missing_ok=True)  # an earlier process's: written anew
    opts = syncer_options(
        job,
        run_dir,
        args.run_id,
        secret,
        budget=not args.no_budget,
        expect=None if args.expect < 0 else args.expect,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        shard=shard,
    )
    events = EventLog(args.events or run_dir / "events.jsonl")
    # `schedule` (pull by default, push as an option) reaches the learners in the Welcome
    s_cfg, l_cfg = job.syncer_config(), job.learner_config()
    try:
        service = SyncerService(plan, init, s_cfg, l_cfg, opts, events)
    except StoreError as exc:  # a state on disk that cannot be restored: no restart helps
        events.record("syncer", RestoreFailed(error=str(exc)[:1000], run_dir=str(run_dir)))
        events.close()
        print(f"atoll syncer: error: {restore_hint(run_dir, str(exc))}", file=sys.stderr)
        return EXIT_STORE
    evaluation = _evaluation(args, job, service, shard)
    http = _http(args, service, shard)  # before the gRPC port: a taken port stops it here
    port = service.start()
    addr = f"{job.live.host}:{port}"
    write_address(run_dir, addr)
    fd = service.fd_limit
    fds = f"descriptors {fd.soft}" + (f" (raised from {fd.before})" if fd.raised else "")
    if fd.soft < 4096:
        fds += f": low, the hard limit is {fd.hard}; raise it (ulimit -Hn) for many learners"
    which = f"shard {shard.label} " if shard else ""
    print(f"atoll syncer: {which}listening on {addr}, run dir {run_dir}, {fds}", flush=True)
    done = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    view = _view(args, job, service, plan, http, events.path)
    if evaluation is not None:
        evaluation.start()
    start, over_at = time.time(), None
    while not done.wait(0.5):
        if view is not None:
            view.tick()
        if over_at is None and service.runtime.over.is_set() and not args.launched:
            over_at = time.time()  # the protocol says the run is over (core/budget.py)
            if not args.serve_after_budget:
                break
            results.write_model(service, run_dir)
            _results(args, job, service, shard, events, start, over_at)
    if view is not None:
        view.stop()
    if http is not None:
        http.close()
    service.stop(final_dir=run_dir)
    if evaluation is not None:
        evaluation.stop()  # its last point, when one was reached as the syncer stopped
    results.write_json(run_dir / "syncer_final.json", results.final_books(service, events.path))
    events.close()
    if over_at is not None and not args.serve_after_budget:
        _results(args, job, service, shard, None, start, over_at)
    # done: a SIGTERM from now on has nothing to stop. Ignored, not left to the handler, which
    # Python resets to the default as it exits: a stop sent as the run ended by itself (a
    # supervisor's, a test's) killed the exiting process (-15) instead of letting it exit 0
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return 0


def _results(
    args: argparse.Namespace,
    job: Any,
    service: SyncerService,
    shard: ShardSpec | None,
    events: EventLog | None,
    start: float,
    end: float,
) -> None:
    """The run is over: syncer_final.json (now, when `events` is still open: it serves on),
    and for a whole run (not one shard of a set) summary.json and report.html."""
    from atoll.live.syncer import results

    if events is not None:
        books = results.final_books(service, events.path)
        results.write_json(args.run_dir / "syncer_final.json", books)
    if shard is None:
        custom = bool(args.init or args.init_from)
        results.write_run_results(args.run_dir, job, custom, start, end)


def _http(
    args: argparse.Namespace, service: SyncerService, shard: ShardSpec | None
) -> HttpEndpoints | None:
    """The HTTP endpoints, when --http-port is given (a shard of a set on one host: the port
    its supervisor gives it)."""
    if not args.http_port:
        return None
    from atoll.errors import ConfigError
    from atoll.live.syncer.endpoints import HttpEndpoints

    port = args.http_port
    if not 0 < port < 65536:
        raise ConfigError("http-port", args.http_port, "a port in [1, 65535]")
    try:
        http = HttpEndpoints(service.runtime, args.http_host, port)
    except OSError as exc:  # in use, or an address this host does not have
        raise ConfigError("http-port", port, f"a free port ({exc.strerror})") from None
    print(f"atoll syncer: metrics on http://{args.http_host}:{http.port}/metrics", flush=True)
    return http


def _evaluation(
    args: argparse.Namespace, job: Any, service: SyncerService, shard: ShardSpec | None
) -> LiveEvaluation | None:
    """The global model's held-out loss while the run goes (syncer/evaluation.py). A shard of
    a set writes its part of each point for the set's supervisor to evaluate (shard_eval.py);
    a shard on its own host evaluates nothing."""
    from atoll.live.syncer.evaluation import LiveEvaluation
    from atoll.live.syncer.shard_eval import part_dir

    points, every_s = job.sim.eval_points, job.live.eval_every_s
    if shard is not None:
        if not (args.eval_parts and job.live.eval):
            return None
        budget = 0 if args.no_budget else job.sim.budget_tokens()  # every shard hears the tokens
        return LiveEvaluation(
            service.runtime, None, points, every_s, part_dir(args.run_dir), budget
        )
    fn = evaluate_for(args, job)
    return None if fn is None else LiveEvaluation(service.runtime, fn, points, every_s)


def evaluate_for(args: argparse.Namespace, job: Any) -> Evaluate | None:
    """The evaluation function of this run's model: the built-in one's, --eval-from's, or none
    (a custom model without --eval-from, or the eval setting false)."""
    from atoll.live.syncer.evaluation import builtin_evaluate, custom_evaluate

    if not job.live.eval:
        return None
    if args.eval_from:
        return custom_evaluate(args.eval_from)
    return None if (args.init or args.init_from) else builtin_evaluate(job.sim)


def _set_view(
    args: argparse.Namespace, job: Any, plan: FragmentPlan, events: Path, learners: int = -1
) -> RunView | None:
    """A view of the run from `events` (live/view.py), unless --view off: a shard set's, from
    what its shards (and local learners) write."""
    if args.view == "off":
        return None
    from atoll.live.view import view_for

    expect = learners if learners >= 0 else (job.sim.learners if args.expect < 0 else args.expect)
    custom = bool(args.init or args.init_from)  # its tokens per step are not known
    view = view_for(args.run_dir, job.sim, expect, plan=plan, events=events, per_step=custom)
    view.title = "atoll syncer (shards)"
    return view


def _view(
    args: argparse.Namespace,
    job: Any,
    service: SyncerService,
    plan: FragmentPlan,
    http: HttpEndpoints | None,
    events: Path | None,
) -> RunView | None:
    """The run as this syncer sees it: its event log, and its learners' beats."""
    from atoll.live.syncer.endpoints import SyncerMetrics

    rt = service.runtime
    view = None if events is None else _set_view(args, job, plan, events, rt.opts.expect_learners)
    if view is None:
        return None
    metrics = http.metrics if http is not None else SyncerMetrics(rt)
    view.title = "atoll syncer" + (f" {rt.opts.shard.label}" if rt.opts.shard.count > 1 else "")

    def hear(state: Any, now: float) -> None:
        s = metrics.status()
        state.heard(s["learners"], now, s["quiet_after_s"], s["tokens"])

    view.hear = hear
    view.start()
    return view


def _start(args: argparse.Namespace, scfg: SimConfig) -> tuple[FragmentPlan, list[torch.Tensor]]:
    """The fragment plan and initial values: a custom model's (--init, --init-from) or the
    built-in one's."""
    from atoll.errors import ConfigError
    from atoll.model.custom import file_plan, model_from, model_plan
    from atoll.model.recipe import builtin_plan

    if args.init and args.init_from:
        raise ConfigError("init-from", args.init_from, "not with --init (one starting point)")
    emb = None if args.embeddings is None else {e for e in args.embeddings.split(",") if e}
    if args.init:
        return file_plan(args.init, scfg.P, scfg.H, emb, scfg.packing)
    if args.init_from:
        return model_plan(model_from(args.init_from), scfg.P, scfg.H, emb, scfg.packing)
    if emb is not None:
        raise ConfigError("embeddings", args.embeddings, "only with --init or --init-from")
    return builtin_plan(scfg)
