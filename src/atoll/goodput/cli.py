"""``atoll goodput``: simulate goodput on a large cluster, or reproduce the paper's table."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from atoll.errors import ConfigError
from atoll.goodput.failures import RecoveryDelay
from atoll.goodput.systems import (
    TABLE_SYSTEMS,
    TIMING_CONSTANTS,
    Cluster,
    Constants,
    parse_system,
)

_TIMING = TIMING_CONSTANTS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chips", type=int, default=1_200_000, help="chips (default 1.2M)")
    parser.add_argument(
        "--mtbi-days",
        type=float,
        default=365.0,
        help="each chip's mean time between interruptions, days (default 365)",
    )
    parser.add_argument(
        "--systems",
        default=",".join(TABLE_SYSTEMS),
        help="comma-separated: dp, dp_elastic, decoupled_m<M>",
    )
    parser.add_argument("--quorum", type=int, default=1, help="Decoupled quorum K (default 1)")
    parser.add_argument("--days", type=float, default=30.0, help="simulated days (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slice-chips", type=int, default=Constants.slice_chips)
    for name in _TIMING:
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=float,
            default=None,
            help="fix this constant instead of fitting it on the paper's data-parallel rows",
        )
    default = RecoveryDelay()
    parser.add_argument(
        "--recovery",
        default=f"{default.a},{default.c},{default.scale_s}",
        help="exponentiated Weibull recovery delay a,c,scale_s",
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="fit on the data-parallel rows, simulate the paper's whole table",
    )
    parser.add_argument("--json", type=Path, default=None, help="write results as JSON here")
    parser.add_argument("--plot", type=Path, default=None, help="write a timeline PNG here")


def _constants(args: argparse.Namespace) -> tuple[Constants, frozenset[str]]:
    try:
        a, c, scale = (float(v) for v in args.recovery.split(","))
    except ValueError:
        raise ConfigError("recovery", args.recovery, "three numbers a,c,scale_s") from None
    if min(a, c, scale) <= 0:
        raise ConfigError("recovery", args.recovery, "a, c and scale_s all positive")
    given = {n: getattr(args, n) for n in _TIMING if getattr(args, n) is not None}
    base = replace(
        Constants(), slice_chips=args.slice_chips, recovery=RecoveryDelay(a, c, scale), **given
    )
    return base, frozenset(given)


def _check(args: argparse.Namespace) -> None:
    if args.chips <= 0:
        raise ConfigError("chips", args.chips, "a positive integer")
    if not args.mtbi_days > 0:
        raise ConfigError("mtbi_days", args.mtbi_days, "a positive number of days")
    if not args.days > 0:
        raise ConfigError("days", args.days, "a positive number of days")


def main(args: argparse.Namespace) -> int:
    from atoll.goodput.calibrate import fit, table

    _check(args)
    base, fixed = _constants(args)
    if args.table:
        doc = table(base, fixed, horizon_s=args.days * 86400.0, seed=args.seed)
        print(format_table(doc))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(doc, indent=1))
        return 0
    from atoll.goodput.simulate import simulate

    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    systems = [parse_system(n, args.quorum if n.startswith("decoupled") else 1) for n in names]
    cluster = Cluster(args.chips, args.mtbi_days * 86400.0)
    constants = fit(base, fixed)
    results = [simulate(s, cluster, constants, args.days * 86400.0, args.seed) for s in systems]
    rate_s = cluster.mtbi_s / cluster.chips
    print(
        f"{cluster.chips:,} chips, chip MTBI {args.mtbi_days:g} days "
        f"(one interruption every {rate_s:.1f} s), {args.days:g} simulated days"
    )
    print(f"{'system':<16}{'goodput':>9}{'uptime':>9}{'interruptions':>15}")
    for r in results:
        print(
            f"{r.system:<16}{100 * r.goodput:>8.1f}%{100 * r.uptime:>8.1f}%{r.interruptions:>15,}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                [
                    {
                        "system": r.system,
                        "chips": r.chips,
                        "goodput": r.goodput,
                        "uptime": r.uptime,
                        "interruptions": r.interruptions,
                    }
                    for r in results
                ],
                indent=1,
            )
        )
    if args.plot:
        from atoll.goodput.plot import plot_timeline

        plot_timeline(results, args.plot, f"{cluster.chips:,} chips, MTBI {args.mtbi_days:g} d")
    return 0


def format_table(doc: dict) -> str:
    """Render the table document: simulated vs paper goodput (%), difference per cell."""
    by_system: dict[str, list[dict]] = {}
    for cell in doc["cells"]:
        by_system.setdefault(cell["system"], []).append(cell)
    chips = [c["chips"] for c in next(iter(by_system.values()))]
    head = "".join(f"{n / 1e6:>17g}M" for n in chips)
    lines = [f"{'system':<15}{head}", f"{'':<15}" + "   sim paper diff " * len(chips)]
    for name, cells in by_system.items():
        row = "".join(
            f"{100 * c['goodput']:>6.1f}{100 * c['paper']:>5.0f}"
            f"{100 * (c['goodput'] - c['paper']):>+6.1f} "
            for c in cells
        )
        lines.append(f"{name:<15}{row}")
    s = doc["summary"]
    lines.append(
        f"MAE fitted rows {100 * s['mae_fit_rows']:.2f} pts; MAE Decoupled rows "
        f"(predictions) {100 * s['mae_decoupled_rows']:.2f} pts; max |diff| "
        f"{100 * s['max_abs_error']:.2f} pts"
    )
    fitted = ", ".join(f"{k}={doc['fitted'][k]:.4g}" for k in doc["fitted"]["fitted_names"])
    lines.append(f"fitted on {'+'.join(doc['fitted']['fitted_on'])}: {fitted}")
    return "\n".join(lines)
