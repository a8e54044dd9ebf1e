"""`atoll sim`: run a preset in the virtual-time driver and report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    from atoll.config import add_set_argument
    from atoll.sim.presets import PRESETS

    p.add_argument(
        "--preset",
        default="quick",
        # argparse formats help with %: a description's "18%" must be written "18%%"
        help="one of: "
        + "; ".join(f"{k}: {v.description}" for k, v in PRESETS.items()).replace("%", "%%"),
    )
    add_set_argument(p, "change a setting of every run (see README for the keys)")
    p.add_argument(
        "--scenario",
        metavar="PATH",
        help="a chaos scenario (.toml, see atoll.chaos; or a spec such as kill:L1@20+3) "
        "applied in virtual time: the same as --set scenario=PATH",
    )
    p.add_argument("--json", type=Path, help="write the results JSON here")
    p.add_argument(
        "--out",
        type=Path,
        help="folder for results.json, events, loss.png and report.html "
        "(default runs/sim-PRESET-sSEED)",
    )
    p.add_argument("--no-plot", action="store_true", help="skip the PNG and report.html")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")
    from atoll.sinks import add_arguments as add_sink_arguments

    add_sink_arguments(p, "tokens, each run once it is done (DIR/RUN)")


def main(args: argparse.Namespace) -> int:
    from atoll.sinks import check

    check(args.tensorboard, args.wandb, args.wandb_mode)  # a missing package stops here, at once
    from atoll.config import parse_overrides
    from atoll.sim.presets import get_preset
    from atoll.sim.report import plot, print_table
    from atoll.sim.runner import plan_runs, read_corpora, run_preset

    preset = get_preset(args.preset)
    overrides = parse_overrides(args.overrides)
    if args.scenario:
        overrides["scenario"] = args.scenario
    corpora = read_corpora(plan_runs(preset, overrides))  # bad settings stop here, before compute
    seed = overrides.get("seed", 0)
    out = args.out or Path("runs") / f"sim-{preset.name}-s{seed}"

    if args.quiet:
        result = run_preset(preset, overrides, events_dir=out, corpora=corpora)
    else:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("{task.description:<28}"),
            BarColumn(),
            TextColumn("{task.percentage:>5.1f}% of tokens"),
            TimeElapsedColumn(),
        ) as bar:

            def factory(name: str):
                task = bar.add_task(name, total=1)

                def update(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                return update

            result = run_preset(preset, overrides, factory, events_dir=out, corpora=corpora)
    text = json.dumps(result, indent=1, sort_keys=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    if not args.no_plot:
        plot(result, out / "loss.png")
    if args.tensorboard or args.wandb:
        from atoll.sim.sinks import write_runs

        write_runs(result, out, args)
    if not args.quiet:
        print_table(result)
        print(
            f"results: {out / 'results.json'}"
            + ("" if args.no_plot else f"  plot: {out / 'loss.png'}")
        )
    if not args.no_plot:
        from atoll.report import try_report

        try_report(out)  # prints its path, or one warning line: never fails the run
    return 0
