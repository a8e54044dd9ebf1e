"""What the syncer's status page costs the rounds: benchmarks/load.py side by side with the page
closed and open (read as a browser does: /status.json every second, /metrics every 5 s),
alternating, --repeats times each; the syncer pinned to CPU 0, the clients to CPU 1.
Reported: the syncer's CPU (mean %% of its core) and the round latency p50/p99 (good clients
only), medians over the repeats, and the ratios open / closed.

    .venv/bin/python benchmarks/status_page_cost.py [--repeats 3 --seconds 30 --clients 16]

Writes benchmarks/results/status_page_cost.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "status_page_cost.json")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"closed": [], "open": []}
    for r in range(args.repeats):
        for mode in ("closed", "open"):
            out = Path(f"/tmp/atoll-page-{mode}-{r}.json")
            cmd = [sys.executable, str(HERE / "load.py"), "--clients", str(args.clients),
                   "--bad", "0", "--seconds", str(args.seconds), "--procs", "2",
                   "--http-port", str(free_port()), "--out", str(out),
                   "--plot", "/dev/null"]  # fmt: skip
            cmd += ["--page-poll-s", "1.0"] if mode == "open" else []
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            rep = json.loads(out.read_text())
            phase = rep["phases"]["all"]  # no misbehaving clients: one phase
            row = {"cpu_pct": rep["syncer"]["cpu_pct_mean"], **phase["latency_ms"]}
            runs[mode].append(row)
            print(f"[{r + 1}/{args.repeats}] page {mode}: {row}", flush=True)
    med = {m: {k: statistics.median(x[k] for x in rs) for k in ("cpu_pct", "p50", "p99")}
           for m, rs in runs.items()}  # fmt: skip
    ratio = {k: med["open"][k] / med["closed"][k] for k in ("cpu_pct", "p50", "p99")}
    result = {"runs": runs, "median": med, "open_over_closed": ratio, "config": vars(args)}
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({"median": med, "open_over_closed": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
