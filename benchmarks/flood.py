"""Flood: idle TCP connections without the secret against a real syncer serving a real learner.

Starts `atoll syncer` (a tiny built-in model, P = H = 4, one learner, no budget) and one
`atoll learner` on loopback. After --before-s it opens --conns TCP connections from this
process that never speak (--mode raw) or send the HTTP/2 preface and then nothing
(--mode preface), holds them --hold-s, closes them, and watches --after-s more. All along it
asks the syncer's Status with the secret every --probe-s (2 s deadline each, a new connection
each time, as `atoll status` does). --syncer-nofile SOFT:HARD starts the syncer under that
descriptor limit (1024:1024: a host where the limit cannot be raised).

Reported per phase (before, flood, after): status calls answered and failed, their latency
p50 / max, the longest span with no answer, and rounds closed (the syncer's round_closed
events) per second.

    .venv/bin/python benchmarks/flood.py --conns 1200 --syncer-nofile 1024:20000

Writes benchmarks/results/flood.json (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUN, SECRET = "flood-run", "flood-secret-0123456789"
TINY = ["n_layer=1", "d_model=16", "n_head=2", "context=16", "batch=4", "P=4", "H=4",
        "data_bytes=200000", "eval_batches=2", "snapshot_every_s=5", "learners=1",
        "start_barrier=false", "eval=false", "pace_s=0.05"]  # fmt: skip
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _sets(extra: list[str]) -> list[str]:
    return [x for kv in [*TINY, *extra] for x in ("--set", kv)]


def _limited(cmd: list[str], spec: str | None) -> list[str]:
    """`cmd` under a descriptor limit SOFT:HARD (util-linux's prlimit; not a preexec_fn:
    forking a process that has used gRPC with Python code to run before exec loses a few
    children in a hundred)."""
    if not spec:
        return cmd
    soft, _, hard = spec.partition(":")
    return ["prlimit", f"--nofile={int(soft)}:{int(hard or soft)}", "--", *cmd]


def start(run_dir: Path, nofile: str | None = None) -> tuple:
    """The syncer (under `nofile`, SOFT:HARD) and one learner, once the learner has joined."""
    from atoll.live.client import status, syncer_address, wait_ready

    env = {**os.environ, "ATOLL_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "atoll.cli", "syncer", "--run-dir", str(run_dir), "--run-id",
           RUN, "--no-budget", *_sets(["steps=100000"])]  # fmt: skip
    syncer = subprocess.Popen(_limited(cmd, nofile), env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)  # fmt: skip
    addr = syncer_address(run_dir, 60, alive=lambda: syncer.poll() is None)
    if addr is None:
        syncer.kill()
        raise RuntimeError(f"the syncer did not start: {syncer.communicate()[0].decode()[-2000:]}")
    wait_ready(addr, RUN, SECRET, 20)
    cmd = [sys.executable, "-m", "atoll.cli", "learner", "--syncer", addr, "--run-id", RUN,
           "--index", "0", *_sets(["steps=100000"])]  # fmt: skip
    learner = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.STDOUT)  # fmt: skip
    until = time.time() + 60
    while time.time() < until and status(addr, RUN, SECRET).rounds < 2:
        if learner.poll() is not None:
            raise RuntimeError(f"the learner ended with {learner.returncode}")
        time.sleep(0.2)
    return syncer, learner, addr


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def open_flood(addr: str, n: int, mode: str) -> list[socket.socket]:
    """Up to `n` connections that never authenticate (fewer if this process runs out)."""
    host, port = addr.rsplit(":", 1)
    socks: list[socket.socket] = []
    for _ in range(n):
        try:
            s = socket.create_connection((host, int(port)), timeout=2)
            if mode == "preface":
                s.sendall(PREFACE)
            socks.append(s)
        except OSError:
            break
    return socks


def probe(addr: str, seconds: float, every: float) -> list[tuple[float, float, bool]]:
    """(time, latency, answered) of a Status call with the secret every `every` s."""
    from atoll.live.client import status

    out, until = [], time.time() + seconds
    while time.time() < until:
        t = time.time()
        try:
            status(addr, RUN, SECRET, timeout=2.0)
            ok = True
        except Exception:  # noqa: BLE001  (DEADLINE_EXCEEDED, UNAVAILABLE: not answered)
            ok = False
        out.append((t, time.time() - t, ok))
        time.sleep(max(0.0, every - (time.time() - t)))
    return out


def summary(probes: list, rounds: list[float], t0: float, t1: float) -> dict:
    lat = sorted(d for _, d, ok in probes if ok)
    gap, last = 0.0, t0
    for t, d, ok in probes:
        if ok:
            gap, last = max(gap, t - last), t + d
    gap = max(gap, t1 - last)
    n = sum(t0 <= r < t1 for r in rounds)
    return {
        "seconds": round(t1 - t0, 2),
        "status_answered": len(lat),
        "status_failed": sum(not ok for *_, ok in probes),
        "status_p50_s": round(lat[len(lat) // 2], 4) if lat else None,
        "status_max_s": round(lat[-1], 4) if lat else None,
        "longest_unanswered_s": round(gap, 2),
        "rounds_closed": n,
        "rounds_per_s": round(n / (t1 - t0), 2),
    }


def run(conns: int, mode: str, hold_s: float, before_s: float = 5.0, after_s: float = 5.0,
        probe_s: float = 0.25, nofile: str | None = None) -> dict:  # fmt: skip
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # this process opens the flood
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        syncer, learner, addr = start(run_dir, nofile)
        socks: list[socket.socket] = []
        try:
            t0 = time.time()
            before = probe(addr, before_s, probe_s)
            t1 = time.time()
            socks = open_flood(addr, conns, mode)
            opened = len(socks)
            flood = probe(addr, hold_s, probe_s)
            t2 = time.time()
            for s in socks:
                s.close()
            socks = []
            after = probe(addr, after_s, probe_s)
            t3 = time.time()
        finally:
            for s in socks:
                s.close()
            stop(learner, syncer)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
        log = syncer.stdout.read().decode() if syncer.stdout else ""
    rounds = [e["t"] for e in events if e["kind"] == "round_closed"]
    started = next((e for e in events if e["kind"] == "syncer_started"), {})
    return {
        "conns_asked": conns,
        "conns_opened": opened,
        "mode": mode,
        "syncer_nofile": nofile or f"{soft}:{hard}",
        "syncer_fd_limit": started.get("data", {}).get("fd_limit"),
        "syncer_line": next((x for x in log.splitlines() if "listening" in x), ""),
        "before": summary(before, rounds, t0, t1),
        "flood": summary(flood, rounds, t1, t2),
        "after": summary(after, rounds, t2, t3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conns", type=int, default=1200)
    ap.add_argument("--mode", choices=["raw", "preface"], default="raw")
    ap.add_argument("--hold-s", type=float, default=15.0)
    ap.add_argument("--before-s", type=float, default=5.0)
    ap.add_argument("--after-s", type=float, default=5.0)
    ap.add_argument("--probe-s", type=float, default=0.25)
    ap.add_argument("--syncer-nofile", default=None, help="SOFT:HARD for the syncer")
    ap.add_argument("--label", default="", help="a name for this run in the JSON")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "flood.json")
    a = ap.parse_args()
    res = run(a.conns, a.mode, a.hold_s, a.before_s, a.after_s, a.probe_s, a.syncer_nofile)
    res["label"] = a.label
    print(json.dumps(res, indent=1))
    runs = json.loads(a.out.read_text()) if a.out.exists() else []
    a.out.write_text(json.dumps([*runs, res], indent=1))


if __name__ == "__main__":
    main()
