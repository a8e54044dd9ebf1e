"""`atoll report RUN_DIR [--out FILE]`: write the run's HTML report and print its path."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dir",
        type=Path,
        metavar="RUN_DIR",
        help="a live run directory (atoll run / demo / syncer) or atoll sim --out output",
    )
    p.add_argument("--out", type=Path, help="the HTML file (default RUN_DIR/report.html)")


def main(args: argparse.Namespace) -> int:
    from atoll.report import write_report

    print(write_report(args.run_dir, args.out))
    return 0
