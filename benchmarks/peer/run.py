"""The peer benchmark: atoll against torchft's synchronous DiLoCo, side by side, on the same
model, data, inner optimizer, learners and token budget (workload.py), each learner one
process, each in its own network namespace with a veth to the host (netns.py) so that both
systems' bytes are counted by the same interface counters, and each capped at --cpu-share
cores (a cgroup quota: an island of its own hardware, whose CPU nobody else gets when it is
killed, stalls or waits).

    benchmarks/peer/setup_env.sh                     # torchft lives in benchmarks/peer/.venv
    benchmarks/peer/.venv/bin/python benchmarks/peer/run.py --repeats 3

Scenarios: a no faults; b one learner 2x slower; c a learner SIGKILLed every --kill-every s and
restarted 5 s later; d every learner's link shaped to --mbps both ways; e d with b and c. The
runs of one repeat alternate the systems; results go to --out (results.json, kept after each
run: an interrupted benchmark resumes), and `report.py` turns them into medians and plots.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload as wl  # noqa: E402
from systems import Atoll, wait_for  # noqa: E402

SCENARIOS = {
    "a": {"slow": False, "kill": False, "shape": False},
    "b": {"slow": True, "kill": False, "shape": False},
    "c": {"slow": False, "kill": True, "shape": False},
    "d": {"slow": False, "kill": False, "shape": True},
    "e": {"slow": True, "kill": True, "shape": True},
}


class Run:
    """One run of one system in one scenario: processes, faults, the poller, counters."""

    def __init__(self, system, scen: dict, rd: Path, args: argparse.Namespace) -> None:
        self.sys, self.scen, self.rd, self.a = system, scen, rd, args
        self.w: wl.Work = system.w
        self.procs: dict[int, subprocess.Popen] = {}
        self.kills: list[dict] = []
        self.done = threading.Event()
        self.env = {**os.environ, "PEER_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    def slow_of(self, rank: int) -> float:
        return self.a.slow_factor if self.scen["slow"] and rank == self.w.learners - 1 else 1.0

    def start_learner(self, rank: int, islands) -> None:
        isl = islands.islands[rank] if islands else None
        host, ns = (isl.host_ip, isl.ns_ip) if isl else ("127.0.0.1", "127.0.0.1")
        argv = self.sys.learner(self.rd, rank, host, ns, self.slow_of(rank))
        if isl is not None:
            argv = isl.wrap(argv)
        if self.a.cpu_share > 0:  # its own island of compute: a fixed CPU quota (outside the
            argv = cpu_cap(rank, self.a.cpu_share) + argv  # namespace, which remounts /sys)
        log = open(self.rd / f"learner-{rank}.log", "a")
        self.procs[rank] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)  # fmt: skip

    def faults(self, islands) -> None:
        """SIGKILL learners 1..M-1 in turn every kill_every s; restart each 5 s later."""
        victim = 0
        while not self.done.wait(self.a.kill_every):
            rank = 1 + victim % (self.w.learners - 1)
            victim += 1
            p = self.procs.get(rank)
            if p is None or p.poll() is not None:
                continue
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            self.kills.append({"rank": rank, "t": time.time()})
            if self.done.wait(self.a.restart_after):
                return
            self.start_learner(rank, islands)

    def go(self, islands) -> dict:
        rd, w = self.rd, self.w
        self.sys.prepare(rd)
        srv_log = open(rd / "server.log", "w")
        srv = subprocess.Popen(self.sys.server(rd), stdout=srv_log, stderr=subprocess.STDOUT,
                               env=self.env, start_new_session=True)  # fmt: skip
        try:
            wait_for(lambda: self.sys.ready(rd), 60, f"{self.sys.name} server")
            before = [i.counters() for i in islands.islands] if islands else None
            t0 = time.time()
            for r in range(w.learners):
                self.start_learner(r, islands)
            th = threading.Thread(target=self.faults, args=(islands,), daemon=True)
            if self.scen["kill"]:
                th.start()
            timed_out = False
            timeline, next_sample = [], 0.0
            while True:
                self.sys.poll(rd)
                if islands and time.time() >= next_sample:  # link bytes over time (plots)
                    next_sample = time.time() + 2.0
                    d = _diff(before, [i.counters() for i in islands.islands])
                    timeline.append({"t": time.time() - t0,
                                     "tx": sum(x["tx_bytes"] for x in d),
                                     "rx": sum(x["rx_bytes"] for x in d),
                                     "rss_server_mb": _rss_mb(srv.pid),
                                     "rss_learners_mb": sum(_rss_mb(p.pid) for p in
                                                            self.procs.values())})  # fmt: skip
                alive = [p for p in self.procs.values() if p.poll() is None]
                restarting = self.scen["kill"] and len(self.kills) and th.is_alive()
                if not alive and not (restarting and self._restart_pending()):
                    break
                if time.time() - t0 > self.a.max_wall:
                    timed_out = True
                    break
                time.sleep(0.5)
            t_end = time.time()
            self.done.set()
            after = [i.counters() for i in islands.islands] if islands else None
        finally:
            self.done.set()
            for p in self.procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            srv.send_signal(signal.SIGTERM)
            try:
                srv.wait(60)
            except subprocess.TimeoutExpired:
                srv.kill()
        self.sys.poll(rd)
        self.sys.finished(rd)
        out = {
            "t0": t0,
            "wall_s": t_end - t0,
            "timed_out": timed_out,
            "exit_codes": {r: p.returncode for r, p in self.procs.items()},
            "kills": self.kills,
            "link_bytes": _diff(before, after),
            "link_timeline": timeline,
            "own": self.sys.own_bytes(rd),
        }
        return out

    def _restart_pending(self) -> bool:
        last = self.kills[-1]
        return time.time() - last["t"] < self.a.restart_after + 2


CGROUP = Path("/sys/fs/cgroup/cpu")  # the cgroup v1 cpu controller (v2: cpu.max, not here)


def cpu_cap(rank: int, share: float) -> list[str]:
    """A prefix that runs a command in cgroup `apb-<rank>` capped at `share` cores (CFS
    quota): each learner is its own island of hardware, so one that is killed, stalls or
    sleeps (the straggler) gives its CPU to nobody, as on separate machines."""
    g = CGROUP / f"apb-{rank}"
    g.mkdir(exist_ok=True)
    period = int((g / "cpu.cfs_period_us").read_text())
    (g / "cpu.cfs_quota_us").write_text(str(int(share * period)))
    return ["sh", "-c", f'echo $$ > {g}/cgroup.procs && exec "$0" "$@"']


def cpu_caps_unavailable() -> str | None:
    if not (CGROUP / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {CGROUP}"
    try:
        cpu_cap(0, 1.0)
    except OSError as exc:
        return f"cannot create a cgroup in {CGROUP}: {exc}"
    return None


def _rss_mb(pid: int) -> float:
    """Resident memory of a process and its descendants (a learner's communication child)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return round(total, 1)


def _diff(before, after):
    if before is None or after is None:
        return None
    return [{k: a[k] - b[k] for k in a} for b, a in zip(before, after, strict=True)]


def make_system(name: str, w: wl.Work, args: argparse.Namespace):
    """ "atoll", "torchft", or a variant of atoll with settings of its own: "atoll:k=v+k=v"."""
    if name == "atoll" or name.startswith("atoll:"):
        return Atoll(w, [*args.atoll_set, *[kv for kv in name[6:].split("+") if kv]])
    from systems_torchft import Torchft

    return Torchft(w, args.sync_every)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenarios", default="a,b,c,d,e")
    ap.add_argument(
        "--systems", default="atoll,torchft", help="also atoll variants: atoll:key=value+key=value"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--learners", type=int, default=4)
    ap.add_argument("--mbps", type=float, default=8.0, help="the shaped link, both ways")
    ap.add_argument("--slow-factor", type=float, default=2.0)
    ap.add_argument("--kill-every", type=float, default=30.0)
    ap.add_argument("--restart-after", type=float, default=5.0)
    ap.add_argument("--sync-every", type=int, default=20, help="torchft's H")
    ap.add_argument("--atoll-set", nargs="*", default=[], help="atoll settings key=value")
    ap.add_argument("--max-wall", type=float, default=900.0)
    ap.add_argument(
        "--cpu-share",
        type=float,
        default=0.45,
        help="cores each learner may use (a cgroup quota; 0: uncapped). 4 x 0.45 on 2 cores "
        "leaves 0.2 core for the syncer or lighthouse and the harness",
    )
    ap.add_argument("--out", type=Path, default=Path("runs/peer"))
    args = ap.parse_args()
    from netns import Islands, unavailable

    w = wl.Work(steps=args.steps, learners=args.learners)
    args.out.mkdir(parents=True, exist_ok=True)
    res_path = args.out / "results.json"
    results = json.loads(res_path.read_text()) if res_path.exists() else {"runs": []}
    results["work"] = json.loads(w.to_json())
    results["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    why = unavailable()
    results["netns"] = why or "each learner in its own namespace"
    if args.cpu_share > 0 and (no_caps := cpu_caps_unavailable()):
        print(f"[peer] learners uncapped: {no_caps}", flush=True)
        args.cpu_share = 0.0
    results["cpu_share"] = args.cpu_share
    done = {(r["system"], r["scenario"], r["repeat"]) for r in results["runs"]}
    systems = args.systems.split(",")
    for rep in range(args.repeats):
        for sc in args.scenarios.split(","):
            order = systems if rep % 2 == 0 else systems[::-1]
            for name in order:
                if (name, sc, rep) in done:
                    continue
                scen = SCENARIOS[sc]
                if scen["shape"] and why:
                    print(f"[peer] skip {sc}/{name}: {why}", flush=True)
                    continue
                rd = args.out / f"{sc}-{name.replace(':', '_').replace('+', '_')}-{rep}"
                if rd.exists():
                    import shutil

                    shutil.rmtree(rd)
                rd.mkdir(parents=True)
                print(f"[peer] {sc} {name} repeat {rep} ...", flush=True)
                with ExitStack() as stack:
                    islands = None
                    if not why:
                        mbps = args.mbps if scen["shape"] else 0.0
                        islands = stack.enter_context(Islands(w.learners, mbps))
                    r = Run(make_system(name, w, args), scen, rd, args).go(islands)
                r.update(system=name, scenario=sc, repeat=rep, dir=str(rd))
                from evaluate import evaluate_run

                r.update(evaluate_run(make_system(name, w, args), rd, r))
                print(f"[peer] {sc} {name} {rep}: wall {r['wall_s']:.0f}s final "
                      f"{r['final_eval']:.3f} link {r.get('link_total')}", flush=True)  # fmt: skip
                results["runs"].append(r)
                res_path.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
