"""`atoll run`: a local live run (syncer + N learner processes, chaos, supervisor)."""

from __future__ import annotations

import argparse
from pathlib import Path

from atoll.live.common import add_config_arguments
from atoll.sinks import add_arguments as add_sink_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--out", type=Path, help="run directory (default runs/live-<time>)")
    p.add_argument(
        "--compare-sim",
        action="store_true",
        help="also run the virtual-time driver with the same settings and record both losses",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run already in --out (its syncer restores from snapshot + tape)",
    )
    p.add_argument("--quiet", action="store_true")
    p.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="the syncer's status page and /metrics on this loopback port (0: none; atoll "
        "demo: a free port, atoll run: none)",
    )
    add_sink_arguments(p)


def main(
    args: argparse.Namespace, defaults: dict[str, object] | None = None, page: bool = False
) -> int:
    """`page`: the status page on a free port unless --http-port says otherwise (atoll demo)."""
    import dataclasses
    import json

    from atoll.config import load_job

    job = load_job(args.overrides, args.config, defaults)
    out = args.out = run_dir(args)
    if not args.resume and any((out / name).exists() for name in ("tape", "snapshot.safetensors")):
        from atoll.errors import ConfigError

        raise ConfigError(
            "--out",
            str(out),
            "a new run directory: this one already holds a run (tape/snapshot); "
            "pass --resume to continue that run, or choose another --out",
        )
    from atoll.sinks import check, open_sinks

    check(args.tensorboard, args.wandb, args.wandb_mode)  # a missing package stops here
    from atoll.live.launcher import Launcher  # (torch: bad flags are answered before it)

    http = args.http_port
    if http is None and page:
        from atoll.live.address import free_port

        shards = job.live.shards  # a shard set: its page on `http`, shard i's on http+1+i
        http = free_port(job.live.host, shards + 1 if shards > 1 else 1)
    launcher = Launcher(job, out, quiet=args.quiet, http_port=http or 0)  # bad data stops here
    # a W&B run that cannot start (online: no server): one line, before any process starts
    launcher.sinks = open_sinks(args.tensorboard, args.wandb, str(out), args.wandb_mode,
                                name=out.name, config=dataclasses.asdict(job.sim))  # fmt: skip
    summary = launcher.run()
    if args.compare_sim:
        from atoll.sim.decoupled import DecoupledSim

        sim = DecoupledSim(job.sim, "virtual_time").run()  # same settings, schedule included
        summary["sim_eval_loss"] = sim.eval_loss
        summary["sim_tokens"] = sim.tokens
        summary["sim_participants_mean"] = sim.participants_mean
        summary["eval_gap_vs_sim"] = (summary["eval_loss"] - sim.eval_loss) / sim.eval_loss
        (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    if not args.quiet:
        print_summary(summary)
    return 0


def run_dir(args: argparse.Namespace) -> Path:
    """--out, or a new runs/live-<time> (chosen once: `atoll demo` reports on the same one)."""
    import time

    return args.out or Path("runs") / f"live-{time.strftime('%Y%m%d-%H%M%S')}"


def print_summary(s: dict) -> None:
    lines = [
        f"eval loss        {s['eval_loss']:.4f} nats/byte"
        + (f"   (virtual-time: {s['sim_eval_loss']:.4f})" if "sim_eval_loss" in s else ""),
        f"tokens           {s['tokens']:,} of a budget of {s['token_budget']:,}",
        f"wall time        {s['wall_time_s']:.1f} s   goodput {100 * s['goodput']:.1f}%",
        f"bytes up/down    {s['bytes_up'] / 1e6:.1f} MB / {s['bytes_down'] / 1e6:.1f} MB"
        f"   (data-parallel: {s['dp_bytes'] / 1e6:.0f} MB)"
        + (
            f"; on the wire {s['wire_up'] / 1e6:.1f} / {s['wire_down'] / 1e6:.1f} MB"
            if s.get("wire_up") is not None
            else ""
        ),  # fmt: skip
        f"rounds           {s['rounds']}   participants/round {s['participants_mean']:.2f}",
        f"faults           {s['failures']} on learners, {s['syncer_kills']} syncer kills; "
        f"rejoin times {s['rejoin_times_s']} s; lost committed rounds "
        f"{s['lost_committed_rounds']}",
        f"crashes          {s['crashes']} processes died on their own, "
        f"{s['threads_died']} threads died (each: restarted; see events.jsonl)",
        f"results          {s['run_dir']}/summary.json, events.jsonl",
    ]
    for lid, up in sorted(s.get("link_bottleneck", {}).items()):
        lines.insert(-1, f"link bottleneck  {lid}: uploads took {up:.2f} s, longer than the "
                     "tau-step overlap; its link, not its compute, set its pace")  # fmt: skip
    print("\n".join(lines), flush=True)
