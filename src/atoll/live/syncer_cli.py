"""`atoll syncer`: the syncer service of a live run (gRPC), durable in --run-dir."""

from __future__ import annotations

import argparse
from pathlib import Path

from atoll.live.common import add_auth_arguments, add_config_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    add_auth_arguments(p)
    p.add_argument("--run-dir", type=Path, required=True, help="tape, snapshots, events, results")
    p.add_argument("--tls-cert", help="PEM certificate (TLS; with --tls-key)")
    p.add_argument("--tls-key", help="PEM private key (TLS; with --tls-cert)")
    p.add_argument(
        "--init",
        help="safetensors file of a custom model's initial parameters (default: the built-in "
        "model from the settings' seed)",
    )
    p.add_argument(
        "--embeddings", default="", help="with --init: comma-separated embedding tensor names"
    )
    p.add_argument("--no-budget", action="store_true", help="run until stopped (no token budget)")
    p.add_argument(
        "--expect", type=int, default=-1, help="learners that start together (default: learners)"
    )


def main(args: argparse.Namespace) -> int:
    import signal
    import sys
    import threading

    from atoll.config import build
    from atoll.errors import EXIT_STORE, restore_hint
    from atoll.eventlog import EventLog
    from atoll.live.syncer import SyncerOptions, SyncerService
    from atoll.live.syncer.store_read import StoreError
    from atoll.model.recipe import builtin_plan, file_plan
    from atoll.wire.auth import load_secret

    scfg, lcfg = build(args.overrides, args.config)
    secret = load_secret(args.secret_file)
    run_dir: Path = args.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.init:
        emb = {e for e in args.embeddings.split(",") if e}
        plan, init = file_plan(args.init, scfg.P, scfg.H, emb, scfg.packing)
    else:
        plan, init = builtin_plan(scfg)
    opts = SyncerOptions(
        run_dir=run_dir,
        run_id=args.run_id,
        secret=secret,
        host=lcfg.host,
        port=lcfg.port,
        chunk_bytes=lcfg.chunk_bytes,
        lost_after_s=lcfg.lost_after_s,
        snapshot_every_s=lcfg.snapshot_every_s,
        snapshot_history=lcfg.snapshot_history,
        tape_fsync=lcfg.tape_fsync,
        token_budget=0 if args.no_budget else scfg.token_budget(),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        expect_learners=scfg.learners if args.expect < 0 else args.expect,
    )
    events = EventLog(run_dir / "events.jsonl")
    # `schedule` (pull by default, push as an option) reaches the learners in the Welcome
    s_cfg, l_cfg = scfg.syncer_config(), scfg.learner_config()
    try:
        service = SyncerService(plan, init, s_cfg, l_cfg, opts, events)
    except StoreError as exc:  # a state on disk that cannot be restored: no restart helps
        events.emit("restore_failed", "syncer", error=str(exc)[:1000], run_dir=str(run_dir))
        events.close()
        print(f"atoll syncer: error: {restore_hint(run_dir, str(exc))}", file=sys.stderr)
        return EXIT_STORE
    port = service.start()
    addr = f"{lcfg.host}:{port}"
    tmp = run_dir / "syncer.addr.tmp"
    tmp.write_text(addr)
    tmp.replace(run_dir / "syncer.addr")
    print(f"atoll syncer: listening on {addr}, run dir {run_dir}", flush=True)
    done = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not done.wait(0.5):
        pass
    service.stop(final_dir=run_dir)
    import json

    (run_dir / "syncer_final.json").write_text(json.dumps(service.final_accounts(), indent=1))
    events.close()
    return 0
