"""``atoll bandwidth``: WAN bandwidth each method needs, and the paper's 198 vs 0.84 Gbps."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, fields, replace
from pathlib import Path

from atoll.bandwidth.model import (
    METHODS,
    PATTERNS,
    BandwidthConfig,
    average_rate,
    required_bandwidth,
)

PAPER_GBPS = {"dp": 198.0, "decoupled": 0.84}
# One assumption changed at a time, to show what the paper's figures are sensitive to.
VARIANTS: dict[str, list[object]] = {
    "utilization": [0.9, 0.95, 0.99],
    "backward_fraction": [0.0, 2.0 / 3.0, 1.0],
    "pattern": list(PATTERNS),
    "bits_dp": [16.0, 32.0],
    "bits": [4.0, 16.0],
    "step_s": [0.5, 1.0, 2.0],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = BandwidthConfig()
    for f in fields(BandwidthConfig):
        kind = (
            str if f.name == "pattern" else (int if isinstance(getattr(d, f.name), int) else float)
        )
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=kind,
            default=getattr(d, f.name),
            help=f"default {getattr(d, f.name)}",
        )
    parser.add_argument(
        "--codec",
        default=None,
        help="take --bits from this codec's frames (int4, int8, bf16, fp32; zstd included), "
        "measured on 2^20 seeded Gaussian values in groups of 64",
    )
    parser.add_argument(
        "--sensitivity",
        action="store_true",
        help="also vary each assumption and compare with the paper's figures",
    )
    parser.add_argument("--json", type=Path, default=None, help="write results as JSON here")


def evaluate(c: BandwidthConfig) -> dict:
    """Required and average bandwidth (Gbps) of every method under `c`."""
    return {
        m: {
            "required_gbps": required_bandwidth(m, c) / 1e9,
            "average_gbps": average_rate(m, c) / 1e9,
        }
        for m in METHODS
    }


def sensitivity(c: BandwidthConfig) -> list[dict]:
    """dp and decoupled requirement, and their ratio, with one assumption changed at a time."""
    rows = []
    for name, values in VARIANTS.items():
        for value in values:
            v = replace(c, **{name: value})
            dp, dec = required_bandwidth("dp", v) / 1e9, required_bandwidth("decoupled", v) / 1e9
            rows.append(
                {
                    "setting": name,
                    "value": value,
                    "dp_gbps": dp,
                    "decoupled_gbps": dec,
                    "ratio": dp / dec,
                }
            )
    return rows


def codec_bits(scheme: str, group: int = 64, n: int = 1 << 20) -> float:
    """Bits per value of `scheme`'s frames, header and zstd included, on n seeded Gaussian
    values: int4's nominal 4.25 (4 bits and a bf16 scale per 64) compresses to about 3.7."""
    import torch

    from atoll.core import codec

    codec.check_scheme(scheme, "--codec")
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    return 8 * len(codec.encode(x, scheme, group)) / n


def main(args: argparse.Namespace) -> int:
    c = BandwidthConfig(**{f.name: getattr(args, f.name) for f in fields(BandwidthConfig)})
    if args.codec:
        c = replace(c, bits=codec_bits(args.codec))
        print(f"{args.codec} frames: {c.bits:.3f} bits per value (Gaussian values, zstd)")
    result = evaluate(c)
    print(
        f"{c.params / 1e9:g}B params, {c.step_s:g} s/step, {c.datacenters} datacenters "
        f"({c.pattern}), utilisation {100 * c.utilization:g}%, P={c.fragments} H={c.H} "
        f"tau={c.tau}, {c.bits_dp:g}-bit dp / {c.bits:g}-bit outer"
    )
    if c.framing != 1 or c.message_bytes or c.control_bps:
        print(f"on the wire: x{c.framing:g} framing, {c.message_bytes:g} B per sync, "
              f"{c.control_bps:g} bit/s control (average rates only)")  # fmt: skip
    print(f"{'method':<11}{'required Gbps':>15}{'average Gbps':>14}{'paper':>8}")
    for m, r in result.items():
        paper = f"{PAPER_GBPS[m]:g}" if m in PAPER_GBPS else ""
        print(f"{m:<11}{r['required_gbps']:>15.4g}{r['average_gbps']:>14.4g}{paper:>8}")
    ratio = result["dp"]["required_gbps"] / result["decoupled"]["required_gbps"]
    print(f"dp / decoupled = {ratio:.0f}x (paper {198 / 0.84:.0f}x)")
    doc: dict = {"config": asdict(c), "codec": args.codec, "methods": result,
                 "paper_gbps": PAPER_GBPS}  # fmt: skip
    if args.sensitivity:
        doc["sensitivity"] = sensitivity(c)
        print(f"{'changed':<18}{'value':>8}{'dp':>10}{'decoupled':>11}{'ratio':>8}")
        for row in doc["sensitivity"]:
            value = row["value"]
            shown = f"{value:.3g}" if isinstance(value, float) else str(value)
            print(
                f"{row['setting']:<18}{shown:>8}{row['dp_gbps']:>10.4g}"
                f"{row['decoupled_gbps']:>11.3g}{row['ratio']:>8.0f}"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1))
    return 0
