"""`atoll run`: a syncer and N learner processes on this machine, a seeded chaos schedule, a
supervisor that restarts killed processes, and the run's summary.

Chaos (setting `chaos`): a scenario of atoll.chaos, the language the virtual-time driver
speaks too: a .toml/.json file, or the compact spec ("kill:L1@20+3,stop:L2@30+2,
kill:syncer@40+2,random:3"). Each fault, live:
    kill         SIGKILL the learner; restarted `duration` later (it heals and rejoins)
    stall        SIGSTOP, SIGCONT `duration` later
    cut, slow    its link carries nothing / uploads at base/factor for `duration` (the
                 built-in shaper, atoll.live.comm.faults; base: shape_mbps, else bandwidth_mbps)
    add          the learner starts at `at` (the run starts without it)
    remove       SIGTERM the learner at `at`, for good
    kill_syncer  SIGKILL the syncer; restarted (from its tape) `duration` later
Times are seconds after training started (every learner present at the start has joined: the
syncer's `start_at`), so that a scenario means the same on a slow machine, where processes take
longer to start; learners that never all join get no chaos. A process that dies unexpectedly
is restarted after `restart_delay_s` too. Ctrl+C (or SIGTERM) stops every child; children also
get SIGTERM if the launcher itself dies (PR_SET_PDEATHSIG), so no process is left behind.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atoll import chaos
from atoll.config import JobConfig, LiveConfig, SimConfig, to_args
from atoll.core.events import (
    Chaos,
    Crashed,
    Restarted,
    RestoreFailed,
    RunEnded,
    RunStarted,
    Started,
    Timeout,
)
from atoll.errors import EXIT_STORE, ConfigError, RunError, restore_hint
from atoll.eventlog import EventLog, load_events
from atoll.live.address import free_port
from atoll.live.comm.faults import write_fault
from atoll.live.comm_mode import resolve_comm
from atoll.live.common import supervised_env
from atoll.live.summary import books_tokens
from atoll.live.view import view_for


@dataclass
class _Proc:
    name: str
    argv: list[str]
    popen: subprocess.Popen | None = None
    restarts: int = 0
    done: bool = False
    down_until: float | None = None  # restart at this time
    stopped_until: float | None = None  # SIGCONT at this time
    spare: subprocess.Popen | None = None  # a warm spare (learners), waiting on `spare_go`
    spare_go: Path | None = None
    spares_made: int = 0  # each spare waits on a file of its own


@dataclass
class Launcher:
    """`atoll run`: the syncer and the learners of one job, as processes of this machine. Each
    child process gets the whole job (`to_args`), with the launcher's port and comm mode."""

    job: JobConfig
    run_dir: Path
    quiet: bool = False
    sinks: list = field(default_factory=list)  # atoll.sinks: TensorBoard, W&B
    http_port: int = 0  # the syncer's status page and /metrics (0: none)
    procs: dict[str, _Proc] = field(default_factory=dict)

    @property
    def scfg(self) -> SimConfig:
        return self.job.sim

    @property
    def lcfg(self) -> LiveConfig:
        return self.job.live

    def __post_init__(self) -> None:
        from atoll.model.recipe import check_data

        # bad data stops here, before any process starts; text is read once, for every learner
        self.corpus_text = check_data(self.scfg)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(self.run_dir / "events.jsonl")
        self.run_id = uuid.uuid4().hex[:12]
        secret_path = self.run_dir / "secret"
        fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, secrets.token_hex(24).encode())
        os.close(fd)
        self.secret_path = secret_path
        shards = self.lcfg.shards  # shard i listens on port + i (atoll.live.syncer.shard_set)
        self.port = self.lcfg.port or free_port(self.lcfg.host, shards)
        self.address = ",".join(f"{self.lcfg.host}:{self.port + i}" for i in range(shards))
        n = self.scfg.learners
        self.lcfg.shape_factors(n)  # a bad per-learner value stops here, not in a learner
        self.islands = self.lcfg.island_sizes(n)
        if any(self.scfg.batch % size for size in self.islands):  # each rank trains batch/size
            raise ConfigError("batch", self.scfg.batch, f"a multiple of island_size {self.islands}")
        spec = self.lcfg.chaos or self.scfg.scenario  # one scenario key drives both drivers
        scenario = chaos.load(spec, self.lcfg.restart_delay_s).validate(n)
        self.chaos = scenario.timeline(n, self.lcfg.max_wall_s, self.lcfg.chaos_seed)
        self.late = scenario.late_learners()  # started when their `add` comes
        self.kill_targets = {f.target for f in self.chaos if f.kind == "kill"}
        (self.run_dir / "faults").mkdir(exist_ok=True)

    def _say(self, text: str) -> None:
        if not self.quiet:
            print(f"[atoll run] {text}", flush=True)

    def _argv(self, kind: str, index: int = 0, restart: int = 0) -> list[str]:
        comm = resolve_comm(self.lcfg.comm, self.scfg.learners)  # all learners on this machine
        settings = to_args(self.job.replace({"live": {"port": self.port, "comm": comm}}))
        base = [sys.executable, "-m", "atoll.cli", kind, *settings]
        auth = ["--run-id", self.run_id, "--secret-file", str(self.secret_path)]
        if kind == "syncer":
            expect = str(self.scfg.learners - len(self.late))
            http = ["--http-port", str(self.http_port)] if self.http_port else []
            run = ["--run-dir", str(self.run_dir), "--expect", expect, "--view", "off"]
            # the launcher shows the run, ends it and writes its results itself
            return [*base, *auth, *run, *http, "--launched"]
        return [
            *base,
            *auth,
            "--syncer",
            self.address,
            "--index",
            str(index),
            "--restart",
            str(restart),
            "--events",
            str(self.run_dir / "events.jsonl"),
            *(["--corpus", str(self.run_dir / "corpus.bin")] if self.corpus_text else []),
            "--faults",
            str(self.run_dir / "faults" / f"L{index}.json"),
        ]

    def _popen(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.run_dir / f"{name}.log", "ab") as log:
            return subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=supervised_env({**os.environ, "PYTHONUNBUFFERED": "1"}),
            )

    def _spawn_spare(self, proc: _Proc) -> None:
        """A learner process that imports everything and waits for `spare_go` (the restart
        count): a restart then costs no interpreter and torch start-up."""
        proc.spares_made += 1
        proc.spare_go = self.run_dir / "spares" / f"{proc.name}-{proc.spares_made}"
        proc.spare_go.parent.mkdir(exist_ok=True)
        argv = [*self._argv("learner", int(proc.name[1:])), "--standby", str(proc.spare_go)]
        proc.spare = self._popen(proc.name, argv)

    def _spawn(self, proc: _Proc, restart: bool = False) -> None:
        spare = proc.spare
        if restart:
            proc.restarts += 1
            if proc.name != "syncer":
                proc.argv = self._argv("learner", int(proc.name[1:]), proc.restarts)
        if spare is not None and spare.poll() is None and proc.spare_go:
            tmp = proc.spare_go.with_suffix(".tmp")
            tmp.write_text(str(proc.restarts))
            tmp.replace(proc.spare_go)  # the spare goes on, as restart `restarts`
            proc.popen, proc.spare = spare, None
            if proc.name in self.kill_targets:  # the next restart's
                self._spawn_spare(proc)
        else:
            proc.popen = self._popen(proc.name, proc.argv)
        proc.down_until = None
        kind = Restarted if restart else Started
        self.events.record("launcher", kind(process=proc.name, pid=proc.popen.pid))

    def _cache_corpus(self) -> None:
        """Text read once: (re)started learners load these bytes instead of the files (a
        token file is memory-mapped by each learner)."""
        if self.corpus_text is not None:
            (self.run_dir / "corpus.bin").write_bytes(self.corpus_text)

    def _training_started(self) -> float | None:
        """The syncer's start time (all expected learners joined), once it has one."""
        from atoll.live.client import status

        try:
            st = status(self.address, self.run_id, self.secret_path.read_text(), 1.0)
        except Exception:  # noqa: BLE001 - the syncer may be restarting: ask again later
            return None
        return st.start_at or None

    def _wait_syncer(self, timeout: float = 60.0, first: bool = True) -> None:
        """Until the syncer answers. One that cannot restore the run ends it (RunError), as
        does any exit of the first start; a restarted one that exits otherwise is left to
        `_supervise`, which restarts it again (a disk that is still full, a port in use)."""
        from atoll.live.client import wait_ready

        popen = self.procs["syncer"].popen
        up = lambda: popen.poll() is None  # noqa: E731
        try:
            if wait_ready(self.address, self.run_id, self.secret_path.read_text(), timeout,
                          alive=up):  # fmt: skip
                return
        except TimeoutError as exc:
            raise RunError(f"{exc}; see {self.run_dir / 'syncer.log'}") from exc
        rc = popen.wait()
        if rc == EXIT_STORE or first:
            raise self._syncer_failed(rc)

    def run(self) -> dict[str, Any]:
        start = time.time()
        self.events.record("launcher", RunStarted(run_id=self.run_id, address=self.address))
        self._cache_corpus()
        self.procs["syncer"] = _Proc("syncer", self._argv("syncer"))
        self._spawn(self.procs["syncer"])
        self._wait_syncer()
        t0: float | None = None  # the chaos clock: when training started
        asked = 0.0
        self._say(f"syncer on {self.address}; starting {self.scfg.learners} learners")
        if self.http_port:
            self._say(f"status page: http://{self.lcfg.host}:{self.http_port}/ (and /metrics)")
        for i in range(self.scfg.learners):
            p = _Proc(f"L{i}", self._argv("learner", i))
            self.procs[p.name] = p
            if p.name not in self.late:
                self._spawn(p)
        chaos = list(self.chaos)
        interrupted, failed = False, None
        view = view_for(self.run_dir, self.scfg, self.scfg.learners, not self.quiet, self.sinks)
        view.start()
        spares = False  # warm spares, for a scenario that kills or adds learners
        # one for each learner the scenario kills or adds (their targets are drawn already):
        # a restart, or a learner added at `at`, then costs no interpreter and torch start-up
        spare_for = (
            self.kill_targets | (set(self.late) & {f.target for f in chaos if f.kind == "add"})
            if self.lcfg.warm_spares and max(self.islands) == 1  # an island starts torchrun
            else set()
        )
        try:
            while True:
                now = time.time()
                if t0 is None and chaos and now - asked >= 0.2:
                    asked = now
                    t0 = self._training_started()
                if t0 is not None and spare_for and not spares:
                    spares = True  # once training started: the start is not slowed by them
                    for name in sorted(spare_for):
                        self._spawn_spare(self.procs[name])
                while chaos and t0 is not None and now - t0 >= chaos[0].at:
                    self._inject(chaos.pop(0), now)
                self._supervise(now)
                view.tick(now)
                learners = [p for n, p in self.procs.items() if n != "syncer"]
                if all(p.done for p in learners) and self._syncer_up():
                    break  # (a syncer that is down is restarted first: it writes the result)
                if now - start > self.lcfg.max_wall_s:
                    self._say(f"max_wall_s={self.lcfg.max_wall_s} reached, stopping")
                    self.events.record("launcher", Timeout(max_wall_s=self.lcfg.max_wall_s))
                    break
                time.sleep(0.05)
        except KeyboardInterrupt:
            interrupted = True
            self._say("interrupted: stopping every process")
        except RunError as exc:  # the run cannot go on: stop every process, then say why
            failed = exc
        finally:
            self._shutdown()
            # the last line with the run's tokens as the syncer's books counted them (the
            # summary's): a killed learner's last step reports may never have reached the log
            view.state.fig.heard_tokens = books_tokens(self.run_dir)
            view.stop()
        end = time.time()
        self.events.record("launcher", RunEnded(interrupted=interrupted))
        if interrupted or failed is not None:
            view.close_sinks()
        if interrupted:
            raise KeyboardInterrupt
        if failed is not None:
            raise failed
        from atoll.live.summary import write_summary

        summary = write_summary(self.run_dir, self.scfg, self.lcfg, start, end)
        view.close_sinks(summary.get("eval_loss"))
        return summary

    def _syncer_failed(self, rc: int) -> RunError:
        """The end of a run whose syncer exited with `rc` and cannot be restarted: why (for
        EXIT_STORE, its `restore_failed` event) and what to do."""
        self.events.record("launcher", Crashed(process="syncer", rc=rc))
        if rc != EXIT_STORE:
            return RunError(f"the syncer exited (code {rc}) before it answered: see syncer.log")
        events = load_events(self.run_dir / "events.jsonl")
        why = [e.data.error for e in events if isinstance(e.data, RestoreFailed)]
        return RunError(restore_hint(self.run_dir, why[-1] if why else "see syncer.log"))

    def _syncer_up(self) -> bool:
        p = self.procs["syncer"]
        return p.popen is not None and p.popen.poll() is None

    def _inject(self, f: chaos.Fault, now: float) -> None:
        target = "syncer" if f.kind == "kill_syncer" else f.target
        proc = self.procs.get(target)
        if proc is None:
            return
        if f.kind == "add":
            if proc.popen is None:
                self._spawn(proc)
        elif f.kind == "remove":  # for good, abruptly (as the virtual-time driver has it)
            proc.done, proc.down_until, proc.stopped_until = True, None, None
            if proc.popen is not None and proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGKILL)
                proc.popen.wait()
        elif proc.popen is None or proc.done or proc.popen.poll() is not None:
            return  # not running now (killed, finished): the fault finds nothing to act on
        elif f.kind in ("kill", "kill_syncer"):
            proc.popen.send_signal(signal.SIGKILL)
            proc.popen.wait()
            proc.down_until, proc.stopped_until = now + f.duration, None
        elif f.kind == "stall":
            proc.popen.send_signal(signal.SIGSTOP)
            proc.stopped_until = now + f.duration
        else:  # cut, slow: the learner's communication side reads its fault file
            path = self.run_dir / "faults" / f"{target}.json"
            if f.kind == "cut":
                write_fault(path, cut_until=time.time() + f.duration)
            else:
                base = self.lcfg.shape_factors(self.scfg.learners)[int(target[1:])]
                write_fault(
                    path,
                    slow_until=time.time() + f.duration,
                    factor=f.factor,
                    base_mbps=base or self.scfg.bandwidth_mbps,
                )
        self.events.record("launcher", Chaos(action=f.kind, process=target, duration_s=f.duration))
        self._say(f"chaos: {f.kind} {target} for {f.duration:.1f} s")

    def _supervise(self, now: float) -> None:
        for proc in self.procs.values():
            if proc.popen is None or proc.done:
                continue
            if proc.stopped_until is not None and now >= proc.stopped_until:
                proc.popen.send_signal(signal.SIGCONT)
                proc.stopped_until = None
            rc = proc.popen.poll()
            if rc is None:
                continue
            if rc == 0 and proc.name != "syncer":
                proc.done = True
                continue
            if rc == EXIT_STORE and proc.name == "syncer":  # restarting it cannot help
                raise self._syncer_failed(rc)
            if proc.down_until is None:  # died on its own: restart after the usual delay
                self.events.record("launcher", Crashed(process=proc.name, rc=rc))
                proc.down_until = now + self.lcfg.restart_delay_s
            if now >= proc.down_until:
                self._spawn(proc, restart=True)
                self._say(f"restarted {proc.name}")
                if proc.name == "syncer":
                    self._wait_syncer(first=False)

    def _shutdown(self) -> None:
        for p in self.procs.values():
            if p.spare is not None and p.spare.poll() is None:
                p.spare.kill()
                p.spare.wait()
        live = [p for p in self.procs.values() if p.popen is not None and p.popen.poll() is None]
        learners = [p for p in live if p.name != "syncer"]
        for p in live:
            if p.stopped_until is not None:
                p.popen.send_signal(signal.SIGCONT)
        for p in learners:
            p.popen.send_signal(signal.SIGTERM)
        _wait_all(learners, 10.0)
        syncer = self.procs.get("syncer")
        if syncer and syncer.popen and syncer.popen.poll() is None:
            syncer.popen.send_signal(signal.SIGTERM)
            _wait_all([syncer], 30.0)


def _wait_all(procs: list[_Proc], timeout: float) -> None:
    until = time.time() + timeout
    for p in procs:
        try:
            p.popen.wait(max(until - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait()
