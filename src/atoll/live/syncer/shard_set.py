"""`atoll syncer --shards S`: a run's shard set (atoll.core.shards) as child processes of one
command, each `atoll syncer --shard i/S` in RUN_DIR/shard-i with its own tape and snapshots.

It writes RUN_DIR/syncer.addr (atomically) as the shards' addresses in shard order (what
learners take) as soon as every shard listens, serves the whole set's HTTP endpoints on
--http-port P (shard_endpoints.py; shard i serves its own on P+1+i), restarts a shard that dies
on the same port (it restores from its own tape while the others go on), and ends the set on
SIGTERM or Ctrl+C, or with a token budget once every shard's run is over (each shard's core
decides for its fragments, core/budget.py; a shard whose run is over writes its results and
exits 0, and is not restarted; with --serve-after-budget it writes them and serves on). It then
writes the run's results as one syncer would: RUN_DIR/final.safetensors (every shard's
fragments), RUN_DIR/syncer_final.json (the books: the home shard's tokens, every shard's bytes,
refusals, restarts and lost rounds summed) and, when the run is over, RUN_DIR/summary.json and
RUN_DIR/report.html (results.py).

`claim` guards a shard's directory: the first start records which shard of which run it holds
(shard.json); a shard started on another shard's directory, or on another run's, stops before
it reads any state, with one line that says which is which.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from atoll.core.shards import check_identity
from atoll.errors import EXIT_STORE, ConfigError
from atoll.live.client import syncer_address, write_address
from atoll.live.common import supervised_env

RESTART_DELAY_S = 0.5  # a shard that died is started again this long after
_OWN_FLAGS = ("--shards", "--shard", "--run-dir", "--events", "--http-port")  # set per shard


def claim(run_dir: Path, ident: dict[str, Any]) -> None:
    """Record which shard `run_dir` holds, or check that it holds this one."""
    path = run_dir / "shard.json"
    if path.exists():
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError("run-dir", str(run_dir), f"a readable shard.json ({exc})") from None
        check_identity(found if isinstance(found, dict) else {}, ident, str(run_dir))
        return
    tape = run_dir / "tape"
    if (run_dir / "snapshot.safetensors").exists() or (tape.is_dir() and any(tape.iterdir())):
        raise ConfigError(
            "run-dir",
            str(run_dir),
            f"a directory without another syncer's state: it holds one but no shard.json (an "
            f"unsharded syncer's, or a copied tape), and this is shard "
            f"{ident['shard']}/{ident['shards']}",
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / "shard.json.tmp"
    tmp.write_text(json.dumps(ident))
    tmp.replace(path)


def _strip(argv: list[str]) -> list[str]:
    """The command line without the flags each shard is given its own value of."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in _OWN_FLAGS:
            skip = True
        elif not a.startswith(tuple(f"{f}=" for f in _OWN_FLAGS)):
            out.append(a)
    return out


class _Shard:
    def __init__(self, index: int, count: int, run_dir: Path, port: int, http: int) -> None:
        self.index, self.count, self.dir, self.port = index, count, run_dir / f"shard-{index}", port
        self.http_port = http  # its own HTTP endpoints (0: none)
        self.popen: subprocess.Popen | None = None
        self.restarts = 0
        if not port and (self.dir / "syncer.addr").exists():  # restarted set: the same port
            self.port = int((self.dir / "syncer.addr").read_text().rsplit(":", 1)[1])

    def over(self) -> bool:
        """Its run is over: it wrote its results (and exited 0, or serves on)."""
        return (self.dir / "syncer_final.json").exists()

    def start(self, base: list[str], events: Path) -> None:
        (self.dir / "syncer.addr").unlink(missing_ok=True)
        argv = [*base, "--shard", f"{self.index}/{self.count}", "--run-dir", str(self.dir)]
        argv += ["--events", str(events), *(["--set", f"port={self.port}"] if self.port else [])]
        argv += ["--http-port", str(self.http_port)] if self.http_port else []
        argv += ["--view", "off"]  # the set's view is the supervisor's
        self.popen = subprocess.Popen(argv, env=supervised_env())

    def address(self) -> str | None:
        popen = self.popen
        addr = syncer_address(self.dir, 120.0, alive=lambda: popen.poll() is None)
        if addr is not None:
            self.port = int(addr.rsplit(":", 1)[1])
        return addr


def run(args: Any, job: Any, count: int, evaluate: Any = None, view: Any = None) -> int:
    """The set: its shards started and supervised; `evaluate`: the model's evaluation, at the
    points every shard writes its part of (shard_eval.py); `view`: the set's live view."""
    from atoll.eventlog import EventLog
    from atoll.live.syncer.shard_eval import SetEvaluation

    run_dir: Path = args.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    events = args.events or run_dir / "events.jsonl"
    base = [sys.executable, "-m", "atoll.cli", *_strip(args._argv)]
    base += ["--eval-parts"] if evaluate is not None else []
    port, http = job.live.port, args.http_port
    shards = [_Shard(i, count, run_dir, port + i if port else 0, http + 1 + i if http else 0)
              for i in range(count)]  # fmt: skip
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    died: list[str] = []
    on_death = lambda name, exc: (died.append(name), done.set())  # noqa: E731
    page = _endpoints(args, shards, on_death)
    log = EventLog(events)
    evaluation = None  # made before any shard starts: it clears an earlier run's parts
    if evaluate is not None:
        evaluation = SetEvaluation(run_dir, count, evaluate, log, on_death=on_death)
    (run_dir / "syncer.addr").unlink(missing_ok=True)  # an earlier set's: written anew
    for sh in shards:
        (sh.dir / "syncer_final.json").unlink(missing_ok=True)  # an earlier run's end
        sh.start(base, events)
    addrs = [sh.address() for sh in shards]
    if any(a is None for a in addrs):
        _stop(shards)
        log.close()
        if page is not None:
            page.close()
        bad = next(sh for sh, a in zip(shards, addrs, strict=True) if a is None)
        rc = bad.popen.poll() if bad.popen else None
        print(f"atoll syncer: shard {bad.index}/{count} did not start (exit {rc})", flush=True)
        return EXIT_STORE if rc == EXIT_STORE else 1
    write_address(run_dir, ",".join(addrs))  # type: ignore[arg-type]
    print(f"atoll syncer: {count} shards on {','.join(addrs)}, run dir {run_dir}", flush=True)
    if evaluation is not None:
        if page is not None:
            evaluation.observers.append(page.reader.evaluated)  # the set's loss chart
        evaluation.start()
    if view is not None:
        if page is not None:  # the learners and tokens as the shards hear them
            st = page.metrics.status
            view.hear = lambda state, now: (
                (s := st()) and state.heard(s["learners"], now, s["quiet_after_s"], s["tokens"])
            )
        view.start()
    start = time.time()
    ending = None if args.launched else _Ending(args, job, run_dir, count, start)
    rc = _supervise(shards, base, events, done, view, ending)
    if died:  # the set's HTTP or evaluation thread raised (its traceback is on stderr above)
        from atoll.live.syncer.runtime import EXIT_THREAD_DIED

        print(f"atoll syncer: thread {died[0]} died, ending the shard set", flush=True)
        rc = EXIT_THREAD_DIED
    if view is not None:  # its last line while the set's endpoints still answer
        view.stop()
    if page is not None:
        page.close()
    _stop(shards)
    if evaluation is not None:
        evaluation.stop()  # after a last look: a point the shards wrote as they stopped
    log.close()
    combine(run_dir, count)
    if ending is not None and ending.at is not None and not args.serve_after_budget:
        ending.write(time.time())
    return rc


class _Ending:
    """The end of a set's run with a token budget: when every shard's run is over, its
    results (summary.json, report.html) once; with --serve-after-budget at that moment, the
    set serving on, else once every shard has exited."""

    def __init__(self, args: Any, job: Any, run_dir: Path, count: int, start: float) -> None:
        self.args, self.job, self.run_dir, self.count, self.start = args, job, run_dir, count, start
        self.at: float | None = None  # when every shard's run was over

    def check(self, shards: list[_Shard]) -> bool:
        """Whether the set is done (every shard's run over and, unless it serves on, every
        shard exited)."""
        if self.at is None and all(sh.over() for sh in shards):
            self.at = time.time()
            if self.args.serve_after_budget:
                combine(self.run_dir, self.count)
                self.write(self.at)
        if self.at is None or self.args.serve_after_budget:
            return False
        return all(sh.popen is None or sh.popen.poll() is not None for sh in shards)

    def write(self, end: float) -> None:
        from atoll.live.syncer.results import write_run_results

        custom = bool(self.args.init or self.args.init_from)
        write_run_results(self.run_dir, self.job, custom, self.start, end)


def _endpoints(args: Any, shards: list[_Shard], on_death: Any) -> Any:
    """The set's HTTP endpoints on --http-port, when given (before any shard starts: a port
    in use stops the set here)."""
    if not args.http_port:
        return None
    from atoll.live.syncer.shard_endpoints import ShardSetEndpoints

    last = args.http_port + len(shards)
    if not 0 < args.http_port or last > 65535:
        top, n = 65535 - len(shards), len(shards)
        why = f"a port in [1, {top}] (the {n} shards serve theirs on the ports after it)"
        raise ConfigError("http-port", args.http_port, why)
    ports = [sh.http_port for sh in shards]
    try:
        page = ShardSetEndpoints(args.http_host, args.http_port, ports, on_death)
    except OSError as exc:  # in use, or an address this host does not have
        raise ConfigError("http-port", args.http_port, f"a free port ({exc.strerror})") from None
    where = f"http://{args.http_host}:{page.port}"
    print(f"atoll syncer: the shard set's status page on {where}/, metrics on {where}/metrics "
          f"(shard i's own on port {args.http_port}+1+i)", flush=True)  # fmt: skip
    return page


def _supervise(
    shards: list[_Shard],
    base: list[str],
    events: Path,
    done: threading.Event,
    view: Any = None,
    ending: _Ending | None = None,
) -> int:
    """Restart a shard that died (on its port, from its tape) until the set is told to end or
    its run is over (`ending`); a shard that cannot restore its state ends the set (restarting
    cannot help); one whose run is over and that exited 0 stays ended."""
    down: dict[int, float] = {}
    while not done.wait(0.1):
        if view is not None:
            view.tick()
        if ending is not None and ending.check(shards):
            return 0
        for sh in shards:
            rc = sh.popen.poll() if sh.popen else None
            if rc is None or (rc == 0 and sh.over()):
                continue
            if rc == EXIT_STORE:
                print(f"atoll syncer: shard {sh.index} cannot restore its run", flush=True)
                return EXIT_STORE
            now = time.monotonic()
            if sh.index not in down:
                down[sh.index] = now + RESTART_DELAY_S
                print(f"atoll syncer: shard {sh.index} exited (code {rc}), restarting", flush=True)
            elif now >= down[sh.index]:
                del down[sh.index]
                sh.restarts += 1
                sh.start(base, events)
    return 0


def _stop(shards: list[_Shard]) -> None:
    live = [sh.popen for sh in shards if sh.popen is not None and sh.popen.poll() is None]
    for p in live:
        p.send_signal(signal.SIGTERM)
    until = time.time() + 30.0
    for p in live:
        try:
            p.wait(max(until - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


_SUMMED = ("bytes_in", "bytes_out", "accepted", "refused", "refused_beats", "broken_transfers")
_SUMMED += ("auth_refused", "restarts", "lost_committed_rounds", "useful_s", "rounds")


def combine(run_dir: Path, count: int) -> None:
    """One syncer's results from the shards' (those that wrote theirs)."""
    from safetensors.torch import load_file, save_file

    dirs = [run_dir / f"shard-{i}" for i in range(count)]
    params: dict = {}
    for d in dirs:
        if (d / "final.safetensors").exists():
            params.update(load_file(str(d / "final.safetensors")))
    if params:
        save_file(params, str(run_dir / "final.safetensors"))
    books = [json.loads((d / "syncer_final.json").read_text()) for d in dirs
             if (d / "syncer_final.json").exists()]  # fmt: skip
    if not books:
        return
    from atoll.live.syncer.books import set_figures
    from atoll.live.syncer.shard_endpoints import newest_versions

    out = dict(books[0])  # the home shard's tokens, start and epochs
    for k in _SUMMED:
        out[k] = sum(b.get(k, 0) for b in books)
    out["versions"] = newest_versions([b.get("versions") for b in books])
    out["shards"] = [{k: b.get(k) for k in ("restarts", "lost_committed_rounds")} for b in books]
    out.update(set_figures(books))  # goodput over the set's window
    tmp = run_dir / "syncer_final.json.tmp"
    tmp.write_text(json.dumps(out, indent=1))
    os.replace(tmp, run_dir / "syncer_final.json")
