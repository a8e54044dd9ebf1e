"""The GPU check's one table (benchmarks/gpu_check.sh): per size and island size (ranks),
tokens/s and MFU of the training loop without and with atoll.Learner, the learner's overhead
and the GPU, from the JSON files benchmarks/scale.py wrote (one per run: 1 rank, 2 ranks).

    python benchmarks/gpu_table.py benchmarks/results/scale/gpu.json [more.json ...]
        [--out benchmarks/results/scale/gpu_table.md]

Prints the table as markdown (and writes it to --out). A row whose GPU is not one of
scale_worker.PEAK_TFLOPS has no MFU ("-"; scale.py's --peak-tflops gives one). Needs only the
standard library (Python 3.10+), so any Python runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HEAD = (
    "size",
    "params",
    "ranks",
    "GPU",
    "tokens/s plain",
    "tokens/s atoll",
    "MFU plain",
    "MFU atoll",
    "overhead",
)


def _pct(x: float | None, sign: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:+.2f}%" if sign else f"{100 * x:.1f}%"


def table_rows(results: list[dict]) -> list[tuple[str, ...]]:
    """One row of cells per size of every result (scale.py's JSON), by parameters then ranks."""
    rows = [r for res in results for r in res["sizes"]]
    rows.sort(key=lambda r: (r["params"], r.get("ranks", 1)))
    out = []
    for r in rows:
        ranks = r.get("ranks", 1)
        gpu = r.get("gpu") or r.get("device", "-")
        out.append((
            r["size"],
            f"{r['params'] / 1e6:.0f}M",
            str(ranks),
            f"{ranks} x {gpu}" if ranks > 1 else gpu,
            f"{r['tokens_per_s_plain']:,.0f}",
            f"{r['tokens_per_s_atoll']:,.0f}",
            _pct(r.get("mfu_plain")),
            _pct(r.get("mfu_atoll")),
            _pct(r["overhead_paired_median"], sign=True),
        ))  # fmt: skip
    return out


def markdown(results: list[dict]) -> str:
    """The table as markdown: a header, its rule and one line per row (tokens/s of the whole
    island; overhead = median over block pairs of atoll / plain step time, minus 1)."""
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "|".join("---" for _ in HEAD) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(results)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path, help="JSON files benchmarks/scale.py wrote")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.results if not p.is_file()]
    if missing:
        ap.error(f"no such file: {missing[0]}")
    text = markdown([json.loads(p.read_text()) for p in args.results])
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
