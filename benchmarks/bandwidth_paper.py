"""Bandwidth model against the paper's 198 vs 0.84 Gbps (8 datacenters).

Writes benchmarks/results/bandwidth_paper.json.

    .venv/bin/python benchmarks/bandwidth_paper.py
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from atoll.bandwidth.cli import PAPER_GBPS, evaluate, sensitivity
from atoll.bandwidth.model import BandwidthConfig

OUT = Path(__file__).parent / "results"


def main() -> None:
    c = BandwidthConfig()
    methods = evaluate(c)
    dp, dec = methods["dp"]["required_gbps"], methods["decoupled"]["required_gbps"]
    doc = {
        "config": asdict(c),
        "methods": methods,
        "paper_gbps": PAPER_GBPS,
        "ratio": dp / dec,
        "paper_ratio": PAPER_GBPS["dp"] / PAPER_GBPS["decoupled"],
        "relative_error": {
            "dp": dp / PAPER_GBPS["dp"] - 1,
            "decoupled": dec / PAPER_GBPS["decoupled"] - 1,
        },
        "sensitivity": sensitivity(c),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bandwidth_paper.json").write_text(json.dumps(doc, indent=1))
    print(
        f"dp {dp:.1f} Gbps (paper 198), decoupled {dec:.3f} Gbps (paper 0.84), "
        f"ratio {dp / dec:.0f}x (paper {doc['paper_ratio']:.0f}x)"
    )


if __name__ == "__main__":
    main()
