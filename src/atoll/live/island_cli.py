"""`atoll island -- torchrun ... train.py ...`: an island's supervisor. It runs the command (a
whole torchrun, or any command) and starts it again, after a backoff, when it fails, so that
an island whose rank died comes back and rejoins the run as one learner.

Why the whole torchrun, and the environment it is given: torchrun's agent keeps one TCP store
for every restart of its workers, and the default process group's keys stay in it. A restarted
rank can read its peer's address from the attempt before (a dead process), and its
`init_process_group` then fails, or hangs until the group's timeout (30 min by default) when
the other rank waits for a connection that never comes. With `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`
every rendezvous round gets a store of its own, on a new port, and torchrun's own
`--max-restarts` works; the supervisor sets it for its command. What torchrun cannot restart
(it gave up, its agent died, a node's rendezvous host went away) this loop restarts.

It stops when the command succeeds (exit 0), on a user error (exit 2, or a line written to
the file named by `ATOLL_ISLAND_STOP`, which the atoll CLI writes on a bad setting: torchrun
itself exits 1 whatever its ranks' codes), after `--max-restarts` restarts, or on SIGTERM or
SIGINT, which it forwards to the command's whole process group.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from atoll.errors import ConfigError

SHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # torch's opt-out: a store per round
STOP_ENV = "ATOLL_ISLAND_STOP"  # a file: a line written there means "do not restart"
RESTART_ENV = "ATOLL_ISLAND_RESTART"  # how many times the supervisor has restarted the command
USER_ERROR = 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-restarts",
        type=int,
        default=10,
        help="restart the command at most this many times (default 10)",
    )
    p.add_argument(
        "--backoff",
        type=float,
        default=1.0,
        help="seconds before the first restart; doubled each time, at most 30 s, and back to "
        "this after a run of 60 s or more (default 1)",
    )
    p.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="-- command", help="the command (torchrun ...)"
    )


def island_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with torchrun's store a new one per rendezvous round."""
    return {**(os.environ if env is None else env), SHARED_STORE_ENV: "1"}


def check_torchrun(command: Sequence[str]) -> None:
    """A torchrun whose restarts in place cannot work stops here: its static rendezvous
    (torchrun's default without --standalone or --rdzv-backend) keeps one store at
    --master-port for every restart, with or without the opt-out, so a restarted rank can hang
    in init_process_group for the group's timeout, unseen by this supervisor."""
    words = list(command)
    at = next((i for i, w in enumerate(words) if Path(w).name == "torchrun"), None)
    if at is None and "torch.distributed.run" in words:
        at = words.index("torch.distributed.run")
    if at is None:
        return
    opts: dict[str, str] = {}
    rest = iter(words[at + 1 :])
    for w in rest:
        if w in ("-m", "--module", "--", "--no-python", "--no_python") or w.endswith(".py"):
            break  # the script and its own arguments
        if w.startswith("--"):
            key, eq, value = w[2:].replace("_", "-").partition("=")
            opts[key] = value if eq else ("" if key == "standalone" else next(rest, ""))
    restarts = opts.get("max-restarts", "0")
    static = "standalone" not in opts and opts.get("rdzv-backend", "static") == "static"
    if static and restarts not in ("", "0"):
        raise ConfigError(
            "torchrun --max-restarts",
            restarts,
            "0 with torchrun's static rendezvous (its store keeps the dead ranks' addresses "
            "and a restarted rank can hang): add --standalone or --rdzv-backend c10d, or "
            "leave the restarts to atoll island",
        )


def note_user_error(line: str) -> None:
    """Under the supervisor: this island stops for good (a bad setting, not a failure)."""
    path = os.environ.get(STOP_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line.rstrip("\n") + "\n")


class Supervisor:
    """Runs `command` until it succeeds, fails with a user error or has failed
    `max_restarts` + 1 times; `stop()` (a signal) ends it, the command first."""

    def __init__(
        self,
        command: Sequence[str],
        max_restarts: int,
        backoff_s: float,
        say=print,  # noqa: ANN001 - a print-like callable
        max_backoff_s: float = 30.0,
        healthy_s: float = 60.0,
    ) -> None:
        if not command:
            raise ConfigError("command", "", "a command after `--` (torchrun ... train.py ...)")
        if max_restarts < 0:
            raise ConfigError("--max-restarts", max_restarts, "an integer >= 0")
        if not backoff_s >= 0:
            raise ConfigError("--backoff", backoff_s, "seconds >= 0")
        check_torchrun(command)
        self.command = beside_python(command)
        self.max_restarts = max_restarts
        self.backoff_s = backoff_s
        self.max_backoff_s = max(max_backoff_s, backoff_s)
        self.healthy_s = healthy_s
        self.say = say
        self.restarts = 0
        self.proc: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._signal = 0

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Forward `signum` to the command's process group and end after it exits."""
        self._signal = signum
        self._stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def run(self) -> int:
        with tempfile.TemporaryDirectory(prefix="atoll-island-") as tmp:
            stop_file = Path(tmp) / "stop"
            return self._loop(stop_file)

    def _loop(self, stop_file: Path) -> int:
        env = island_env()
        env[STOP_ENV] = str(stop_file)
        delay = self.backoff_s
        while True:
            env[RESTART_ENV] = str(self.restarts)
            t0 = time.monotonic()
            try:
                # its own process group: a signal reaches torchrun and every rank it started
                self.proc = subprocess.Popen(self.command, env=env, start_new_session=True)
            except OSError as exc:
                allowed = f"a command that runs ({exc.strerror})"
                raise ConfigError("command", self.command[0], allowed) from None
            if self._stopping.is_set():  # a signal came while it started
                self.stop(self._signal)
            rc = self.proc.wait()
            ran = time.monotonic() - t0
            if self._stopping.is_set():
                return rc if rc >= 0 else 128 - rc
            if rc == 0:
                return 0
            if rc == USER_ERROR or stop_file.exists():
                why = stop_file.read_text().strip() if stop_file.exists() else f"exit {rc}"
                self.say(f"atoll island: not restarted: a user error ({why})")
                return USER_ERROR
            if self.restarts >= self.max_restarts:
                self.say(f"atoll island: exit {rc}; {self.restarts} restarts done, giving up")
                return rc if rc > 0 else 1
            if ran >= self.healthy_s:
                delay = self.backoff_s
            self.restarts += 1
            self.say(
                f"atoll island: exit {rc} after {ran:.1f} s; restart {self.restarts}/"
                f"{self.max_restarts} in {delay:g} s"
            )
            if self._stopping.wait(delay):
                return 128 + self._signal
            delay = min(delay * 2, self.max_backoff_s)


def beside_python(command: Sequence[str]) -> list[str]:
    """`command`, its program taken from this Python's own bin directory when it is not on PATH
    (`torchrun` of the environment atoll runs in, called as .venv/bin/atoll without it active)."""
    out = list(command)
    if out and "/" not in out[0] and shutil.which(out[0]) is None:
        here = Path(sys.executable).parent / out[0]
        if os.access(here, os.X_OK):
            out[0] = str(here)
    return out


def supervise(command: Sequence[str], max_restarts: int, backoff_s: float = 1.0) -> int:
    """Run `command` under a `Supervisor` that SIGTERM and SIGINT stop; its exit code."""
    sup = Supervisor(command, max_restarts, backoff_s, say=_say)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: sup.stop(signum))
    return sup.run()


def restarts_so_far() -> int:
    """How often this island was started again: by the supervisor, and by torchrun in place."""
    return sum(int(os.environ.get(k, 0)) for k in (RESTART_ENV, "TORCHELASTIC_RESTART_COUNT"))


def main(args: argparse.Namespace) -> int:
    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    return supervise(command, args.max_restarts, args.backoff)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
