"""The running syncer's CPU per contributed value, and where it goes, step by step.

For each model size: benchmarks/load.py with --clients good clients and no misbehaving ones
(the built-in model at d_model x n_layer, P = H = 24, the syncer's default settings: int4 up
and down, pull schedule, the fused round, the tape; syncer pinned to one CPU, clients to the
other). py-spy samples the syncer process (every thread that is running, native frames
included) from --warmup-s (every client has joined and healed by then) to the end of the run.

Reported per size:
  ns per contributed value   the syncer's CPU seconds in the window / the values of the
                             contributions its closed rounds merged in it (participants x
                             fragment values): everything the process did, all-in;
  steps                      the syncer's own thread CPU seconds by step in the window
                             (/metrics: atoll_syncer_cpu_seconds_total{step}, read at its start
                             and end; live/syncer/cpu.py), as ns per contributed value; `rest`:
                             the process's CPU beyond them (gRPC, protobuf, Python, heartbeats);
  sampled                    py-spy's split of the same window (the innermost frame that names a
                             step, STEPS below): it also counts threads that were runnable on
                             the syncer's one core, not running, so it over-weights long steps.
Each size runs --repeats times (the sizes in turn); its row holds the medians of its runs. Two
sizes give the line CPU per contribution = fixed + ns_per_value * values (snapshots, a cost
per snapshot and not per contribution, left out; given apart, in CPU seconds per snapshot).

    .venv/bin/python benchmarks/syncer_service.py [--sizes 512x8,1024x8] [--seconds 60]
        [--step-s 2] [--clients 8] [--repeats 3]
        [--out benchmarks/results/syncer_service/service.json]

Needs py-spy (a dev dependency) and the right to trace a child process (root, or
kernel.yama.ptrace_scope 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "syncer_service"

# (step, substrings of a frame "function (file:line)"): the first OWNERS steps take a stack
# that names them anywhere; else the first step whose pattern matches the innermost frame that
# matches any
STEPS = [
    ("snapshot", ("_snapshot", "write_snapshot")),
    ("tape record", ("commit_record", "Tape.append", "_tape_call")),
    ("heal", ("heal", "Heal")),
    ("crc", ("crc32",)),
    ("decompress", ("ZSTD_decompress", "_decompress (", "decompress (")),
    ("compress", ("ZSTD_compress", "compress (")),
    ("measure (frame)", ("body_squares",)),
    ("merge", ("merge.<locals>", "merge (", "merge_flat")),
    ("step + encode", ("step_encode", "outer.py", "delivery.py", "quant.py")),
    ("history", ("history.py",)),
    (
        "protobuf / gRPC",
        (
            "convert.py",
            "_server.py",
            "_channel.py",
            "grpc",
            "protobuf",
            "chunks.py",
            "Assembler",
            "upb",
        ),
    ),  # fmt: skip
    (
        "events / metrics / page",
        (
            "eventlog.py",
            "metrics.py",
            "sinks.py",
            "prometheus",
            "view.py",
            "books.py",
            "roster.py",
            "page.py",
        ),
    ),  # fmt: skip
    ("protocol (python)", ("atoll/core/",)),
    ("memory (page faults, copies)", ("memcpy", "memmove", "memset", "page_fault", "clear_page")),
]


# a thread waiting (a lock, a condition, a queue, epoll): py-spy's native stacks count it
WAITS = ("PyThread_acquire_lock_timed", "pthread_cond_timedwait", "pthread_cond_wait",
         "epoll_wait", "sem_wait", "_queue_SimpleQueue_get_impl", "pthread_mutex_lock",
         "nanosleep", "select")  # fmt: skip


OWNERS = 3


def step_of(stack: list[str]) -> str | None:
    """The step of one sampled stack (outermost first), or None for a waiting thread."""
    if any(w in f for f in stack[-4:] for w in WAITS):
        return None
    for step, pats in STEPS[:OWNERS]:  # whatever a snapshot or a tape record calls is theirs
        if any(p in f for f in stack for p in pats):
            return step
    for frame in reversed(stack):
        for step, pats in STEPS:
            if any(p in frame for p in pats):
                return step
    return "other"


def profile(path: Path) -> Counter:
    counts: Counter = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        step = step_of(stack.split(";")) if stack and n.isdigit() else None
        if step is not None:
            counts[step] += int(n)
    return counts


def run_size(d_model: int, n_layer: int, args: argparse.Namespace) -> dict:
    tag = f"{d_model}x{n_layer}"
    out = args.out.parent / f"load_{tag}.json"
    cmd = [sys.executable, str(HERE / "load.py"), "--clients", str(args.clients), "--bad", "0",
           "--procs", "2", "--d-model", str(d_model), "--n-layer", str(n_layer), "--step-s",
           str(args.step_s), "--seconds", str(args.seconds), "--warmup-s", str(args.warmup_s),
           "--out", str(out), "--plot", str(out.with_suffix(".png"))]  # fmt: skip
    port = free_port()
    cmd += ["--http-port", str(port)]
    cmd += [x for s in args.sets for x in ("--set", s)]
    cmd += [x for e in args.syncer_env for x in ("--syncer-env", e)]
    print(f"[{tag}] {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    raw = Path(tempfile.mkdtemp(prefix="atoll-pyspy-")) / f"pyspy_{tag}.txt"  # (large: not kept)
    spy: list = []
    window: list[float] = []
    cpu: list[dict[str, float]] = []  # the steps' CPU seconds at the window's start and end
    times: list[tuple[float, float]] = []  # the process's user and system CPU seconds, then

    def watch() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("syncer pid "):
                pid = int(line.split()[2])
                spy.append(pid)
            if line.startswith("workers ready") and spy:
                time.sleep(args.warmup_s)
                dur = max(int(args.seconds - args.warmup_s), 5)
                window.extend([time.time(), time.time() + dur])
                cpu.append(cpu_steps(port))
                times.append(user_sys(pid))
                spy.append(subprocess.Popen(
                    [args.py_spy, "record", "--pid", str(spy[0]), "--duration", str(dur),
                     "--rate", "50", "--format", "raw", "--native", "-o",
                     str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
            if line.startswith("[atoll syncer]") or "wrote" in line:
                print(f"[{tag}] {line.rstrip()[:160]}", file=sys.stderr, flush=True)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    while proc.poll() is None:  # the window's end, read while the syncer still runs
        time.sleep(0.2)
        if len(window) == 2 and len(cpu) == 1 and time.time() >= window[1]:
            cpu.append(cpu_steps(port))
            times.append(user_sys(spy[0]))
    proc.wait()
    t.join(5)
    if len(spy) > 1:
        spy[1].wait(timeout=60)
    rep = json.loads(out.read_text())
    run_dir = Path(rep["run_dir"])
    snap_file = run_dir / "snapshot.safetensors"
    snap_bytes = snap_file.stat().st_size if snap_file.exists() else 0
    ph = rep["phases"]["all"]
    cpu_s = rep["syncer"]["cpu_s"]
    merged = ph["merged_values_per_s"] * ph["seconds"]
    contributions = ph["rounds"] * ph["participants_mean"]
    steps = profile(raw) if raw.exists() else Counter()
    total = sum(steps.values()) or 1
    ns = 1e9 * cpu_s / merged if merged else float("nan")
    numel = merged / contributions if contributions else 0
    measured = {k: cpu[1][k] - cpu[0][k] for k in cpu[0]} if len(cpu) == 2 else {}
    snap_cpu = measured.get("snapshot", 0.0)
    snapshots = 0
    if len(window) == 2:  # snapshot events within py-spy's window
        lines = (run_dir / "events.jsonl").read_text().splitlines()
        events = [json.loads(x) for x in lines if '"snapshot"' in x]
        snapshots = sum(window[0] <= e["t"] < window[1] for e in events if e["kind"] == "snapshot")
    row = {
        "model": tag,
        "params": rep["model"].get("params") if isinstance(rep.get("model"), dict) else None,
        "fragment_values": round(numel),
        "seconds": ph["seconds"],
        "rounds": ph["rounds"],
        "contributions": round(contributions, 1),
        "participants_mean": ph["participants_mean"],
        "syncer_cpu_s": cpu_s,
        "merged_values": merged,
        "ns_per_contributed_value": ns,
        "cpu_ms_per_contribution": 1e3 * cpu_s / contributions if contributions else None,
        # the same without the snapshots (a cost per snapshot, not per contribution)
        "ns_per_contributed_value_without_snapshots": 1e9 * (cpu_s - snap_cpu) / merged,
        "cpu_ms_per_contribution_without_snapshots": (
            1e3 * (cpu_s - snap_cpu) / contributions if contributions else None
        ),
        "user_s": times[1][0] - times[0][0] if len(times) == 2 else None,
        "system_s": times[1][1] - times[0][1] if len(times) == 2 else None,
        "snapshots_in_window": snapshots,
        "cpu_s_per_snapshot": snap_cpu / snapshots if snapshots else None,
        "snapshot_bytes": snap_bytes,  # the last one's file
        "snapshot_ns_per_byte": (
            1e9 * snap_cpu / snapshots / snap_bytes if snapshots and snap_bytes else None
        ),
        "steps_cpu_s": measured,
        "steps_ns_per_value": {
            **{k: 1e9 * v / merged for k, v in measured.items()},
            "rest": 1e9 * (cpu_s - sum(measured.values())) / merged,
        },
        "errors": rep["good"]["errors"],
        "sampled_ns_per_value": {k: ns * v / total for k, v in steps.most_common()},
        "samples": total,
    }
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)  # (GBs: the tape and snapshots)
        shutil.rmtree(raw.parent, ignore_errors=True)
    print(f"[{tag}] {ns:.2f} ns per contributed value all-in; steps: "
          + ", ".join(f"{k} {v:.2f}" for k, v in row["steps_ns_per_value"].items()),
          file=sys.stderr, flush=True)  # fmt: skip
    return row


def median_row(rows: list[dict]) -> dict:
    """Each number the median of the runs' (nested dicts too); the rest from the first."""
    import statistics

    def med(vals: list) -> object:
        if isinstance(vals[0], dict):
            return {k: med([v.get(k, 0.0) for v in vals]) for k in vals[0]}
        nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if nums and all(v is None or v in nums for v in vals):
            return statistics.median(nums)  # (a run without a snapshot has None for its cost)
        return vals[0]

    return {k: med([r[k] for r in rows]) for k in rows[0]}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def user_sys(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process `pid`, every thread."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    hz = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / hz, int(fields[12]) / hz


def cpu_steps(port: int) -> dict[str, float]:
    """The syncer's atoll_syncer_cpu_seconds_total{step} from its /metrics."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("atoll_syncer_cpu_seconds_total{"):
            step = line.split('step="')[1].split('"')[0]
            out[step] = float(line.rsplit(" ", 1)[1])
    return out


def fit(rows: list[dict]) -> dict | None:
    """CPU seconds per contribution (snapshots left out) = fixed + ns_per_value * 1e-9 *
    values, the least-squares line through the sizes."""
    key = "cpu_ms_per_contribution_without_snapshots"
    pts = [(r["fragment_values"], r[key] / 1e3) for r in rows if r[key]]
    if len({x for x, _ in pts}) < 2:
        return None
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return {"ns_per_value": slope * 1e9, "fixed_ms_per_contribution": (my - slope * mx) * 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="512x8,1024x8", help="d_model x n_layer, comma-separated")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup-s", type=float, default=20.0)
    ap.add_argument("--step-s", type=float, default=2.0)
    ap.add_argument("--set", dest="sets", action="append", default=["eval=false"],
                    help="a syncer setting (default: eval=false: the live evaluation of the "
                    "global model costs per evaluation point, not per contribution)")  # fmt: skip
    ap.add_argument("--syncer-env", action="append", default=[], help="KEY=VALUE")
    ap.add_argument("--repeats", type=int, default=3, help="runs per size (rows: medians)")
    ap.add_argument("--keep", action="store_true", help="keep the runs' folders (GBs)")
    ap.add_argument("--py-spy", default=shutil.which("py-spy") or str(Path(sys.executable).parent
                                                                      / "py-spy"))  # fmt: skip
    ap.add_argument("--out", type=Path, default=OUT / "service.json")
    a = ap.parse_args(argv)
    if not os.access(a.py_spy, os.X_OK):
        ap.error(f"--py-spy {a.py_spy!r} is not an executable: pip install py-spy")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    sizes = a.sizes.split(",")
    runs: dict[str, list[dict]] = {s: [] for s in sizes}
    for k in range(a.repeats):  # the sizes in turn, so that a slow spell hits both
        for s in sizes:
            print(f"[repeat {k + 1}/{a.repeats}]", file=sys.stderr, flush=True)
            runs[s].append(run_size(*map(int, s.split("x")), a))
    rows = [median_row(runs[s]) for s in sizes]
    doc = {"clients": a.clients, "step_s": a.step_s, "seconds": a.seconds, "sets": a.sets,
           "syncer_env": a.syncer_env, "repeats": a.repeats,
           "rows": rows, "runs": runs, "fit": fit(rows)}  # fmt: skip
    a.out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc["fit"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
