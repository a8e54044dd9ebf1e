"""`LearnerOptions`: everything `atoll.Learner` takes besides the model, the inner optimizer
and the syncer's address, in one checked object (the built-in learner's comes from the run's
settings: atoll.config.options.learner_options)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from atoll.config.live import check_comm
from atoll.errors import ConfigError


@dataclass(frozen=True)
class LearnerOptions:
    """`learner_id`: its name in the run (default: learner-<random>); `run_id`, and `secret`
    or `secret_file` (a file holding it; neither: ATOLL_SECRET, else none), must be the
    syncer's; `tls_ca`: the CA file of a syncer that speaks TLS.
    `wait_s`: how long a step boundary waits at most for an answer due before the next step
    (0: never waits; the answer is applied when it comes). `shape_mbps`: an upload limit of
    its own (0: none). `heartbeat_s`: how often it tells the syncer it is alive.
    `connect_timeout_s`: the join timeout (no heal by then: `JoinTimeoutError`; a child
    process's start counts). `events`: a JSON-lines file for its events (or an EventLog).
    `comm`: "process", "thread" or "auto" (a process with 2+ cores per learner process on
    this machine). `switch_interval_s`: with comm threads, `sys.setswitchinterval` for the
    whole process (Python's 5 ms can delay the training thread after each torch op; `atoll
    learner` uses 2e-4); None: the interpreter is left alone. `faults_file`: chaos only (the
    launcher's faults for this learner, atoll.live.comm.faults)."""

    learner_id: str | None = None
    run_id: str = "atoll"
    secret: str | None = field(default=None, repr=False)
    secret_file: str | None = None
    tls_ca: str | None = None
    wait_s: float = 0.0
    shape_mbps: float = 0.0
    heartbeat_s: float = 0.5
    connect_timeout_s: float = 60.0
    events: Any = None
    comm: str = "auto"
    switch_interval_s: float | None = None
    faults_file: str | None = None

    def __post_init__(self) -> None:
        # (name, its least value: 0 allowed or not, infinity allowed: wait for ever)
        for name, positive, endless in (("wait_s", False, True), ("shape_mbps", False, False),
                                        ("heartbeat_s", True, False),
                                        ("connect_timeout_s", True, True)):  # fmt: skip
            v = getattr(self, name)
            ok = isinstance(v, int | float) and (v > 0 if positive else v >= 0)
            if not ok or not (math.isfinite(v) or endless):
                raise ConfigError(name, v, ("a number > 0" if positive else "a number >= 0")
                                  + (" (inf: for ever)" if endless else ""))  # fmt: skip
        check_comm(self.comm)
        if self.switch_interval_s is not None and not self.switch_interval_s > 0:
            raise ConfigError("switch_interval_s", self.switch_interval_s, "a number > 0, or None")
