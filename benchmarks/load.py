"""Load: one real syncer, many lightweight learner clients on loopback, some misbehaving.

Starts `atoll syncer` as a subprocess (the built-in model at --d-model/--n-layer, P=H=24, int4
up, fp32 down, pull schedule, K=1 + grace, no token budget, max_learners raised to the clients
when over the default 100) and --clients well-behaved clients in --procs worker processes
(benchmarks/load_clients.py). After --bad-after-s (default: a third of the run) --bad
misbehaving clients join on top, cycling slow reader, vanisher and reconnect storm: slow
readers and storms in one process, vanishers in one that is SIGKILLed every --kill-every-s and
started again 1 s later (new incarnations). With --shards S > 1 it is `atoll syncer --shards
S` (a supervisor and S shard processes) and every client joins every shard (load_clients.py).
With 2+ CPUs the syncer is pinned to the first min(S, CPUs - 1) CPUs (the shards share them:
on 2 cores, one) and every client process to the others (--no-pin: not). /proc/<pid> of the
syncer (of each shard) is sampled every 0.2 s (RSS, CPU seconds, threads); memory and CPU
below are their sums, and per shard the rounds, latency and learners per round of the
fragments it serves, the good clients' errors on it, its RSS and CPU.

Definitions (window: after --warmup-s; phases: good only, then with the misbehaving clients):
  rounds/s       round_closed events / the phase's length. The pull clock ticks once per
                 reported step time with one fragment per tick (nominal 1/step_s); a round
                 closed by its grace window before every answer came opens a second one.
  round latency  a round_closed event's time minus the syncer's send time (PullRequest.at) of
                 the newest Pull of that fragment before it: pull delivery, the clients' wait
                 for their next step boundary (uniform in [0, step_s]), pushes, merge, grace.
                 Also: quorum_wait_s + grace_s of the event (first contribution sent -> close).
  errors (good)  every RPC error, refused push, ended stream or known=False heartbeat that a
                 good client saw, plus the syncer's refused / transfer_broken events naming one.
  memory         net RSS: RSS minus the growth of the version history the protocol keeps by
                 design (64 public versions per fragment); steady: outside snapshots (3 s
                 before a snapshot event to 0.5 s after). Reported: steady net peaks without
                 and with the misbehaving clients, per quarter of the run, the slope over the
                 last half, and the design cap of what the syncer holds per session (outbox:
                 one fp32 update per fragment; pending contributions: one fp32 value per
                 fragment; one gRPC message in flight per stream; one partial push). glibc's
                 allocator keeps freed memory (dynamic mmap threshold): to see the syncer's own
                 growth, add --syncer-env MALLOC_MMAP_THRESHOLD_=131072.

    nice -n 15 .venv/bin/python benchmarks/load.py --clients 64 --bad 8 --seconds 60
    nice -n 15 .venv/bin/python benchmarks/load.py --clients 128 --bad 8 --shards 2 \
        --out benchmarks/results/load_shards2_128.json \
        --plot benchmarks/results/load_shards2_128.png

Writes benchmarks/results/load.json and load.png (--out, --plot).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from load_report import BAD_KINDS, PREFIX, analyze, plot

HERE = Path(__file__).resolve().parent


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = ap.add_argument
    add("--clients", type=int, default=64, help="well-behaved clients")
    add("--bad", type=int, default=8, help="misbehaving clients, on top of --clients")
    add("--seconds", type=float, default=60.0, help="how long the good clients run")
    add("--bad-after-s", type=float, default=None, help="misbehaving clients start (s/3)")
    add("--warmup-s", type=float, default=5.0, help="left out of rates and latency")
    add("--shards", type=int, default=1, help="syncer shards (atoll syncer --shards S)")
    add("--procs", type=int, default=8, help="worker processes for the good clients")
    add("--step-s", type=float, default=0.25, help="clients' step time: the pull clock")
    add("--d-model", type=int, default=128, help="built-in model width")
    add("--n-layer", type=int, default=4, help="built-in model depth")
    add("--slow-read-s", type=float, default=10.0, help="slow reader: seconds per read (0: never)")
    add("--vanish-s", type=float, default=3.0, help="vanisher: seconds between cut pushes")
    add("--kill-every-s", type=float, default=10.0, help="SIGKILL the vanishers (0: never)")
    add("--storm-pause-s", type=float, default=0.1, help="storm: pause between joins")
    add("--bad-kinds", default="slow,vanish,storm", help="the misbehaving kinds, in turn")
    add("--no-pin", action="store_true", help="do not pin the syncer and clients to CPUs")
    add("--syncer-env", action="append", default=[], help="KEY=VALUE for the syncer (malloc)")
    add("--set", dest="sets", action="append", default=[], help="a syncer setting KEY=VALUE")
    add("--http-port", type=int, default=0, help="the syncer's status page and /metrics")
    add("--page-poll-s", type=float, default=0.0, help="with --http-port: read the page as a "
        "browser does, /status.json this often (and /metrics every 5 s)")  # fmt: skip
    add("--out", type=Path, default=HERE / "results" / "load.json")
    add("--plot", type=Path, default=HERE / "results" / "load.png")
    args = ap.parse_args()
    if args.bad_after_s is None:
        args.bad_after_s = args.seconds / 3
    args.kinds = [k for k in args.bad_kinds.split(",") if k]
    if not set(args.kinds) <= set(BAD_KINDS) or (args.bad and not args.kinds):
        ap.error(f"--bad-kinds: a comma-separated list of {', '.join(BAD_KINDS)}")
    return args


def shard_pids(pid: int, count: int) -> list[int]:
    """The shard processes under supervisor `pid`, in shard order: its children
    (/proc/PID/task/*/children; psutil is not installed) by their `--shard i/S`."""
    found = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
        for kid in kids:
            argv = Path(f"/proc/{kid}/cmdline").read_text().split("\0")
            if "--shard" in argv:
                found[int(argv[argv.index("--shard") + 1].split("/")[0])] = kid
    return [found[i] for i in range(count) if i in found]


class Sampler(threading.Thread):
    """(time, RSS MB, CPU seconds, threads) of each syncer process (the shards), every 0.2 s:
    `per[i]` for pid i, `rows` their sums at each sample where every one was read."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids, self.rows, self.done = pids, [], threading.Event()
        self.per: list[list[tuple]] = [[] for _ in pids]
        self.hz = os.sysconf("SC_CLK_TCK")

    def read(self, pid: int) -> tuple | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return None
        f = stat[stat.rindex(")") + 2 :].split()
        kv = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if "VmRSS" not in kv:  # absent once the process is a zombie
            return None
        cpu = (int(f[11]) + int(f[12])) / self.hz  # utime + stime
        return int(kv["VmRSS"].split()[0]) / 1024, cpu, int(kv["Threads"])

    def run(self) -> None:
        while not self.done.wait(0.2):
            now, got = time.time(), [self.read(p) for p in self.pids]
            for rows, g in zip(self.per, got, strict=True):
                if g is not None:
                    rows.append((now, *g))
            if all(g is not None for g in got):
                self.rows.append((now, *(sum(g[i] for g in got) for i in range(3))))


class Tail:
    """The syncer's events.jsonl, read as it grows."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos, self.events, self.rest = path, 0, [], ""

    def poll(self) -> None:
        if self.path.exists():
            with open(self.path) as fh:
                fh.seek(self.pos)
                lines = (self.rest + fh.read()).split("\n")
                self.pos = fh.tell()
            self.rest = lines.pop()
            self.events += [json.loads(x) for x in lines if x.strip()]


def syncer_sets(args: argparse.Namespace) -> list[str]:
    n = args.clients + args.bad  # every client joins every shard: each takes all n sessions
    sets = [f"learners={n}", f"d_model={args.d_model}", f"n_layer={args.n_layer}"]
    return [*sets, f"max_learners={max(100, n)}", *args.sets]


def fragment_numels(args: argparse.Namespace) -> list[int]:
    from atoll.config import build
    from atoll.model.recipe import builtin_plan

    plan, _ = builtin_plan(build(syncer_sets(args))[0])
    return [f.numel for f in plan.fragments]


def start_syncer(args: argparse.Namespace, run_dir: Path, env: dict, cpus: list[int]):
    """`atoll syncer` (with --shards S > 1: the supervisor of S shard processes, which inherit
    its CPU affinity); its process, address(es) and the pids of the processes that serve."""
    from atoll.live.client import syncer_address

    cmd = [sys.executable, "-m", "atoll.cli", "syncer", "--run-dir", str(run_dir)]
    cmd += ["--shards", str(args.shards)] if args.shards > 1 else []
    cmd += ["--http-port", str(args.http_port)] if args.http_port else []
    cmd += ["--run-id", "load", "--no-budget"] + [
        x for s in syncer_sets(args) for x in ("--set", s)
    ]
    log = open(run_dir / "syncer.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if cpus:  # still single-threaded (interpreter start-up): every later thread inherits it
        os.sched_setaffinity(proc.pid, cpus)
    addr = syncer_address(run_dir, 120, alive=lambda: proc.poll() is None)
    if addr is None:
        proc.kill()
        raise SystemExit(f"the syncer did not start: see {run_dir / 'syncer.log'}")
    pids = shard_pids(proc.pid, args.shards) if args.shards > 1 else [proc.pid]
    if len(pids) != args.shards:
        proc.kill()
        raise SystemExit(f"{len(pids)} shard processes under {proc.pid}, not {args.shards}")
    return proc, addr, pids


def spawn(cfg: dict, env: dict) -> subprocess.Popen:
    env = {**env, "GRPC_VERBOSITY": "ERROR"}  # the storms' channels log every goaway at INFO
    path = Path(cfg["results"]).with_suffix(".cfg")
    path.write_text(json.dumps(cfg))
    log = open(path.with_suffix(".log"), "a")  # noqa: SIM115
    cmd = [sys.executable, str(HERE / "load_clients.py"), str(path)]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def progress(tail: Tail, rows: list, t0: float, last: list) -> None:
    now, c = time.time(), Counter(e["kind"] for e in tail.events)
    j = next((k for k in range(len(rows)) if rows[k][0] >= now - 5), 0)
    cpu = 100 * (rows[-1][2] - rows[j][2]) / max(rows[-1][0] - rows[j][0], 1e-6)
    rate = (c["round_closed"] - last[0]) / max(now - last[1], 1e-6)
    good = sum(
        e["kind"] in ("refused", "transfer_broken") and e["data"]["learner"].startswith("G")
        for e in tail.events
    )
    print(
        f"t={now - t0:4.0f}s rounds {c['round_closed']:5d} ({rate:4.1f}/s)"
        f" rss {rows[-1][1]:5.0f} MB cpu {cpu:5.1f}% threads {rows[-1][3]:3d}"
        f" accepted {c['accepted']:6d} refused+broken: good {good} all"
        f" {c['refused'] + c['transfer_broken']} joins {c['joined']:5d}",
        flush=True,
    )
    last[:] = [c["round_closed"], now]


def poll_page(args: argparse.Namespace, done: threading.Event) -> None:
    """What an open status page costs the syncer: `/` once, `/status.json` every
    --page-poll-s seconds (the page's own refresh), `/metrics` every 5 s (a Prometheus scrape)."""
    import urllib.request

    base = f"http://127.0.0.1:{args.http_port}"
    urllib.request.urlopen(base + "/", timeout=5).read()
    last_scrape = 0.0
    while not done.wait(args.page_poll_s):
        try:
            urllib.request.urlopen(base + "/status.json", timeout=5).read()
            if time.time() - last_scrape >= 5.0:
                last_scrape = time.time()
                urllib.request.urlopen(base + "/metrics", timeout=5).read()
        except OSError:
            continue


def main() -> int:
    args = parse_args()
    children: list[subprocess.Popen] = []
    try:
        return run(args, children)
    finally:  # an error or Ctrl+C: no syncer or worker is left running
        for p in children:
            if p.poll() is None:
                p.kill()


def run(args: argparse.Namespace, children: list) -> int:
    run_dir = Path(tempfile.mkdtemp(prefix="atoll-load-"))
    env = {**os.environ, "ATOLL_SECRET": secrets.token_hex(16)}
    cpus = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cpus) >= 2
    from atoll.core.shards import assign

    numels = fragment_numels(args)
    shard_of = assign(numels, args.shards)
    senv = {**env, **dict(x.split("=", 1) for x in args.syncer_env)}
    n_sync = max(1, min(args.shards, len(cpus) - 1))  # the shards' CPUs; at least one for clients
    proc, addr, pids = start_syncer(args, run_dir, senv, cpus[:n_sync] if pin else [])
    children.append(proc)
    sampler = Sampler(pids)
    sampler.start()
    if args.http_port and args.page_poll_s > 0:
        threading.Thread(target=poll_page, args=(args, sampler.done), daemon=True).start()
    print(f"syncer pid {proc.pid} (shards {pids}) at {addr}, run dir {run_dir}", flush=True)
    base = {
        "address": addr, "run_id": "load", "step_s": args.step_s, "vanish_s": args.vanish_s,
        "slow_read_s": args.slow_read_s, "storm_pause_s": args.storm_pause_s,
        "cpus": cpus[n_sync:] if pin else [], "start_file": str(run_dir / "start.json"),
    }  # fmt: skip
    good = [(f"G{i:02d}", "good") for i in range(args.clients)]
    kinds = [args.kinds[i % len(args.kinds)] for i in range(args.bad)]
    bad = [(f"{PREFIX[k]}{i}", k) for i, k in enumerate(kinds)]
    groups = [good[i :: args.procs] for i in range(args.procs)]
    groups += [[c for c in bad if c[1] != "vanish"], [c for c in bad if c[1] == "vanish"]]
    cfgs = []
    for i, g in enumerate(groups):
        late, out = i >= args.procs, str(run_dir / f"w{i}.json")  # late: the misbehaving ones
        cfgs += [{**base, "clients": g, "seed": i, "late": late, "results": out}] if g else []
    procs = [spawn(c, env) for c in cfgs]
    children += procs
    where = f"syncer on CPUs {cpus[:n_sync]}, clients on {cpus[n_sync:]}" if pin else "unpinned"
    if pin and args.shards > n_sync:
        where += f" ({args.shards} shard processes share {n_sync} CPU(s): {len(cpus)} in all)"
    print(f"{args.clients} good + {len(bad)} bad clients, {len(procs)} processes, {where}")
    while not all(Path(c["results"] + ".ready").exists() for c in cfgs):
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"a worker process failed: see {run_dir}/w*.log")
        time.sleep(0.1)
    t0 = time.time() + 0.5
    t_end = t0 + args.seconds
    t_bad = t0 + args.bad_after_s if args.bad else t_end
    (run_dir / "start.json").write_text(
        json.dumps({"start": t0, "deadline": t_end, "late_start": t_bad})
    )
    hz = os.sysconf("SC_CLK_TCK")
    stats = [Path(f"/proc/{p.pid}/stat").read_text() for p in procs]
    before = sum(sum(map(int, x[x.rindex(")") + 2 :].split()[11:13])) for x in stats) / hz
    print(f"workers ready: {args.seconds:.0f} s, misbehaving clients from {args.bad_after_s:.0f} s")
    tail, kills, last = Tail(run_dir / "events.jsonl"), 0, [0, t0]
    vi = next((i for i, c in enumerate(cfgs) if c["clients"][0][1] == "vanish"), None)
    next_kill, next_print = t_bad + args.kill_every_s, t0 + 5
    while time.time() < t_end + 2:
        time.sleep(0.2)
        tail.poll()
        now = time.time()
        if vi is not None and args.kill_every_s > 0 and next_kill <= now < t_end - 3:
            procs[vi].send_signal(signal.SIGKILL)  # the vanishers die mid-stream, come back
            procs[vi].wait()
            kills += 1
            time.sleep(1.0)
            procs[vi] = spawn(cfgs[vi], env)
            children.append(procs[vi])
            next_kill = now + args.kill_every_s
        if now >= next_print and sampler.rows:
            progress(tail, sampler.rows, t0, last)
            next_print = now + 5
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            print(f"worker {p.pid} did not finish: killed")
            p.kill()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers (the syncer is not reaped)
    client_cpu = ru.ru_utime + ru.ru_stime - before  # from the start (imports left out)
    t_stop = time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        print("the syncer did not stop within 60 s of SIGTERM: killed")
        proc.kill()
    sampler.done.set()
    tail.poll()
    done = [Path(c["results"]) for c in cfgs if Path(c["results"]).exists()]
    if len(done) < len(cfgs):
        print(f"{len(cfgs) - len(done)} worker(s) wrote no results: see {run_dir}/w*.log")
    results = [json.loads(p.read_text()) for p in done]
    rows = (sampler.rows, sampler.per)
    rep = analyze(args, tail.events, results, rows, numels, shard_of, (t0, t_bad, t_end), kills)
    rep["syncer"].update(stop_s=round(time.time() - t_stop, 2), rc=proc.returncode, pinned=pin)
    rep["syncer"]["cpus"] = cpus[:n_sync] if pin else "unpinned"
    rep["syncer"]["shard_pids"] = pids
    ncpu = len(cpus) - 1 if pin else len(cpus)
    rep["clients_cpu"] = {
        "cpu_s": round(client_cpu, 1),
        "pct_of_their_cpus": round(100 * client_cpu / (t_end - t0) / ncpu, 1),
        "cpus": ncpu,
        "note": "all worker processes from the start (a restarted vanisher's imports included)",
    }
    rep["run_dir"] = str(run_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rep, indent=1))
    plot(rep, tail.events, t0, t_bad, args.plot)
    print(json.dumps({k: v for k, v in rep.items() if k not in ("timeline", "config")}, indent=1))
    print(f"wrote {args.out} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
