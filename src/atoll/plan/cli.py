"""``atoll plan``: the syncer's shards, cores, RAM and bandwidth, from measured rates."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields, replace
from pathlib import Path

from atoll.errors import ConfigError
from atoll.plan.model import PAPER, PER_CONTRIBUTION_S, PlanConfig, paper_setting, plan

SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
SHOWN = {"params", "shards"}  # read by hand below (sizes and a list of them)


def parse_size(text: str) -> float:
    """'100M', '1.5B', '12e9' -> a number of parameters (ConfigError otherwise)."""
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * SUFFIX[t[-1]] if t and t[-1] in SUFFIX else float(t)
    except ValueError:
        raise ConfigError("params", text, "a number such as 1e9, 100M or 12B") from None
    if not 0 < value < float("inf"):
        raise ConfigError("params", text, "a positive number of parameters")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = PlanConfig()
    parser.add_argument(
        "--params",
        default="1B",
        help="parameters: 1e9, 100M, 12B; several separated by commas give one row each",
    )
    for f in fields(PlanConfig):
        if f.name in SHOWN:
            continue
        value = getattr(d, f.name)
        kind = str if isinstance(value, str) else (int if isinstance(value, int) else float)
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=kind,
            default=value,
            help=f"default {value:g}" if kind is not str else f"default {value}",
        )
    parser.add_argument(
        "--shards",
        type=int,
        default=None,
        help="this many syncer shards (default: as many as the CPU needs)",
    )
    parser.add_argument(
        "--codec",
        default=None,
        help="take --bits from this codec's frames (int4, int8, bf16, fp32)",
    )
    parser.add_argument(
        "--paper",
        action="store_true",
        help="also the paper's setting: 12B over 4 regions at 2 and 5 Gbps",
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write the plan as JSON to PATH (no PATH: to stdout, no table)",
    )


def configs(args: argparse.Namespace) -> list[PlanConfig]:
    if args.shards is not None and args.shards < 1:
        raise ConfigError("shards", args.shards, "a positive integer (leave it out: as needed)")
    settings = {f.name: getattr(args, f.name) for f in fields(PlanConfig) if f.name not in SHOWN}
    if args.codec:
        from atoll.bandwidth.cli import codec_bits

        settings["bits"] = codec_bits(args.codec)
    sizes = [parse_size(s) for s in str(args.params).split(",")]
    return [PlanConfig(params=n, shards=args.shards or 0, **settings) for n in sizes]


def _size(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def _bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} B"


def _gbps(g: float) -> str:
    return f"{g:.3g} Gbps" if g >= 1 else f"{g * 1e3:.3g} Mbps"


def render(plans: list[dict], paper: list[dict] | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=180)
    c = plans[0]["config"]
    title = (
        f"atoll plan: {c['step_s']:g} s/step, P={c['fragments']} H={c['H']} "
        f"tau={c['tau']}, {c['learners']} learners, {c['bits']:.3g} bits/value, "
        f"links {c['link_gbps']:g} Gbps"
    )
    table = Table(title=title)
    for col in (
        "model",
        "contrib/s",
        "CPU (cores)",
        "shards",
        "cores",
        "RAM",
        "RAM/shard",
        "snapshot interval >=",
        "tape writes",
        "syncer in/out",
        "learner up",
        "util",
        "hosts",
        "vs dp",
        "vs DiLoCo",
    ):
        table.add_column(col, justify="right")
    for p in plans:
        P = p["config"]["fragments"]
        shards = str(p["shards"]) + (
            "" if p["feasible"] else f" (> P={P}!)" if p["shards_needed"] > P else " (too few!)"
        )
        s = p["speedup"]
        inout = _gbps(p["syncer_in_gbps"]).split(" ")[0] + "/" + _gbps(p["syncer_out_gbps"])
        table.add_row(
            _size(p["config"]["params"]),
            f"{p['contributions_per_s']:.3g}",
            f"{p['cpu_cores_load']:.3g}",
            shards,
            str(p["cores"]),
            _bytes(p["ram_bytes"]),
            _bytes(p["ram_per_shard_bytes"]),
            f"{p['snapshot_every_s_min']:.3g} s",
            _bytes(p["tape_bytes_per_s"]) + "/s",
            inout,
            _gbps(p["learner_up_gbps"]),
            f"{s['utilization']['decoupled']:.3g}",
            str(p["hosts"]),
            f"{s['over_dp']:.3g}x",
            f"{s['over_diloco']:.3g}x",
        )
    console.print(table)
    if not all(p["feasible"] for p in plans):
        console.print(
            "! a shard's round is one thread: more shards than fragments cannot "
            "help; a faster round (--ns-per-value) or a longer step is needed"
        )
    every = c["history_full_every"]
    frames = f"a full one every {every}" if every else "no full one"
    console.print(
        f"{plans[0]['bytes_per_param']:.0f} bytes/parameter at a snapshot, "
        f"{plans[0]['steady_bytes_per_param']:.1f} between (history of {c['history']} "
        f"versions as broadcast frames, {frames}; atoll.core.memory), "
        f"{c['ns_per_value']:.1f} ns/value "
        f"+ {PER_CONTRIBUTION_S * 1e3:.1f} ms per contribution (BENCHMARKS.md s10c), "
        "shards at most "
        f"{c['max_core_load']:g} of a core, 2 cores each; snapshots at most 1/10 of a "
        "shard's core; util: Decoupled's compute utilisation at the link; speedup: its "
        "utilisation over each method's (atoll.bandwidth) at this link, communication only"
    )
    if paper:
        t = Table(
            title=f"paper's setting: 12B, 4 regions, {c['step_s']:g} s/step, "
            f"bf16 ring all-reduce (dp), int4 DiLoCo, P={c['fragments']} "
            f"H={c['H']} tau={c['tau']}; paper: {PAPER['claim']}"
        )
        for col in ("link", "dp util", "DiLoCo util", "Decoupled util", "vs dp", "vs DiLoCo"):
            t.add_column(col, justify="right")
        for s in paper:
            u = s["utilization"]
            t.add_row(
                f"{s['link_gbps']:g} Gbps",
                f"{u['dp']:.3g}",
                f"{u['diloco']:.3g}",
                f"{u['decoupled']:.3g}",
                f"{s['over_dp']:.3g}x",
                f"{s['over_diloco']:.3g}x",
            )
        console.print(t)


def main(args: argparse.Namespace) -> int:
    cs = configs(args)
    plans = [plan(c) for c in cs]
    paper = paper_setting(replace(cs[0], shards=0)) if args.paper else None
    doc = {"plans": plans, "paper": paper, "paper_claim": PAPER["claim"]}
    if args.json == "-":
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    render(plans, paper)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0
