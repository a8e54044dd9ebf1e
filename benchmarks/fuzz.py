"""Fuzzing of everything atoll reads from the network or disk: codec frames, chunk reassembly,
protobuf messages and their metadata, contributions into the syncer core, tape records and
snapshots, settings files and `--set` pairs (the families: benchmarks/fuzzing/__init__.py).

    .venv/bin/python benchmarks/fuzz.py [--cases 10000] [--family NAME ...] [--seed N]
        [--memory-limit-mib 3072] [--out benchmarks/results/fuzz.json]

Each family runs in a child process of its own (one at a time) under an address-space limit,
so that an unbounded allocation fails there (and is counted) instead of taking the machine;
the child's peak RSS is reported beside the per-case traced peaks. Cases are hypothesis'
(derandomized unless --seed; no example database). Writes the JSON and a bar chart
(fuzz.png) next to it: per family cases, refused, accepted, crashes with a reproducer each
(`fuzzing.FAMILIES[name].check(case)`), max/median seconds and peak traced bytes per case.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

ORDER = ("codec", "chunks", "messages", "syncer", "store", "config")


def _child(name: str, cases: int, seed: int | None, limit_mib: int, q: mp.Queue) -> None:
    if limit_mib > 0:
        lim = limit_mib * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    import torch

    torch.set_num_threads(1)
    from fuzzing import FAMILIES
    from fuzzing.harness import rss_kib, run_family

    start_rss = rss_kib()
    out = run_family(FAMILIES[name], cases, seed)
    out["rss_start_kib"], out["rss_peak_kib"] = start_rss, rss_kib()
    q.put(out)


def run_one(name: str, cases: int, seed: int | None, limit_mib: int) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(name, cases, seed, limit_mib, q))
    p.start()
    out = None
    while p.is_alive() or not q.empty():
        try:
            out = q.get(timeout=1.0)
            break
        except Exception:
            continue
    p.join()
    if out is None:
        return {"cases": 0, "crashes": 1, "error": f"the child process ended with {p.exitcode}"}
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    refused = [results[n].get("refused", 0) for n in names]
    accepted = [results[n].get("accepted", 0) for n in names]
    crashes = [results[n].get("crashes", 0) for n in names]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(names, refused, label="refused (clear error)", color="#4c72b0")
    ax.bar(names, accepted, bottom=refused, label="accepted (checked)", color="#55a868")
    bottom = [r + a for r, a in zip(refused, accepted, strict=True)]
    ax.bar(names, crashes, bottom=bottom, label="crashes", color="#c44e52")
    for i in range(len(names)):
        ax.text(i, bottom[i], f"{crashes[i]} crashes", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.12 * max([*bottom, 1]))
    ax.set_ylabel("generated cases")
    ax.set_title("atoll fuzzing: outcome per decoder family")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000, help="cases per family")
    ap.add_argument("--family", action="append", choices=ORDER, help="(repeatable) default: all")
    ap.add_argument(
        "--seed", type=int, default=None, help="hypothesis seed (default: derandomized)"
    )
    ap.add_argument("--memory-limit-mib", type=int, default=3072, help="per child, 0: none")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "fuzz.json")
    args = ap.parse_args(argv)
    names = args.family or list(ORDER)
    results = {}
    t0 = time.time()
    for name in names:
        print(f"{name}: {args.cases} cases", file=sys.stderr, flush=True)
        results[name] = run_one(name, args.cases, args.seed, args.memory_limit_mib)
        r = results[name]
        print(
            f"{name}: {r.get('cases')} cases, {r.get('refused')} refused, {r.get('accepted')} "
            f"accepted, {r.get('crashes')} crashes, max {r.get('max_s', 0) * 1e3:.1f} ms/case, "
            f"peak traced {r.get('peak_traced_bytes_max', 0) / 1024:.0f} KiB",
            file=sys.stderr,
            flush=True,
        )
    doc = {
        "command": " ".join(["benchmarks/fuzz.py", *(argv if argv is not None else sys.argv[1:])]),
        "cases_per_family": args.cases,
        "seed": args.seed,
        "memory_limit_mib": args.memory_limit_mib,
        "machine": f"{platform.machine()} python {platform.python_version()}",
        "wall_s": round(time.time() - t0, 1),
        "families": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.exists() and args.family:  # a partial run updates the families it ran
        old = json.loads(args.out.read_text())
        old.get("families", {}).update(results)
        doc["families"] = {n: old["families"][n] for n in ORDER if n in old["families"]}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc["families"], args.out.with_suffix(".png"))
    total = sum(r.get("crashes", 0) for r in results.values())
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}: {total} crashes", file=sys.stderr)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
