"""The `atoll` command. Each subcommand lives in its own module, imported only when used.

A subcommand module exposes ``add_arguments(parser)`` and ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from atoll.errors import ConfigError, LearnerError, RunError

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("atoll.sim.cli", "run Decoupled DiLoCo and its baselines in the virtual-time driver"),
    "goodput": ("atoll.goodput.cli", "datacenter-scale goodput simulator (chips, failures)"),
    "bandwidth": ("atoll.bandwidth.cli", "WAN bandwidth each method needs"),
    "plan": ("atoll.plan.cli", "capacity plan: the syncer's shards, cores, RAM and bandwidth"),
    "syncer": ("atoll.live.syncer_cli", "live syncer service (gRPC), durable tape + snapshots"),
    "learner": ("atoll.live.learner_cli", "live learner process training the built-in model"),
    "island": ("atoll.live.island_cli", "restart an island (-- torchrun ...) when it fails"),
    "run": ("atoll.live.run_cli", "local live run: a syncer, N learners, chaos, summary"),
    "demo": ("atoll.live.demo_cli", "a few-minute live demo: 4 learners, one slow, one killed"),
    "report": ("atoll.report.cli", "one self-contained HTML report (plots) of a run directory"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser; only `command`'s module is imported (the others list their help)."""
    parser = argparse.ArgumentParser(prog="atoll", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from atoll.live.common import tie_to_parent

    tie_to_parent()  # a child of `atoll run` or of a shard set ends with it
    if argv[:1] == ["--"]:  # an island's ranks: torchrun hands them the command after "--"
        argv = argv[1:]
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    args._argv = list(argv)  # the command line itself (an island's learner runs it again)
    try:
        return int(args._module.main(args) or 0)
    except (ConfigError, LearnerError) as exc:  # bad input, or a learner that cannot join
        print(f"atoll {args.command}: error: {exc}", file=sys.stderr)
        from atoll.live.island_cli import note_user_error

        note_user_error(f"atoll {args.command}: {exc}")  # under `atoll island`: no restart
        return 2
    except OSError as exc:
        if exc.filename is None:  # not a path the user gave: a defect, with its traceback
            raise
        print(f"atoll {args.command}: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except RunError as exc:
        print(f"atoll {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"atoll {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
