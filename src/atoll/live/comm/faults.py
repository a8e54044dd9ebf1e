"""Link faults of a live run, injected by the launcher's chaos (atoll.chaos): a learner's
link cut for a while (nothing goes up or down, no heartbeats: the syncer finds it silent, as a
real cut would make it) or slowed (uploads shaped at base / factor).

The launcher writes the state to a small JSON file per learner,
``{"cut_until": t, "slow_until": t, "factor": f, "base_mbps": m}`` (wall-clock seconds), and
the communication side reads it at most every POLL_S. This is the built-in shaper; on a host
where the run may create network namespaces, `tc` on a veth pair does the same to real
packets (atoll.chaos documents the scenario language).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

POLL_S = 0.2


class LinkFaults:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self._read_at = 0.0
        self._mtime = 0.0
        self._state: dict[str, float] = {}

    def _current(self) -> dict[str, float]:
        now = time.monotonic()
        if self.path is None or now - self._read_at < POLL_S:
            return self._state
        self._read_at = now
        try:
            mtime = os.stat(self.path).st_mtime
            if mtime != self._mtime:
                self._mtime = mtime
                self._state = json.loads(Path(self.path).read_text())
        except (OSError, ValueError):
            pass  # no file (no fault yet), or one being written: keep what we had
        return self._state

    def cut(self) -> bool:
        return time.time() < float(self._current().get("cut_until", 0.0))

    def wait_while_cut(self, closing) -> None:  # noqa: ANN001 - a threading.Event
        while self.cut() and not closing.is_set():
            closing.wait(0.1)

    def slow_bps(self) -> float:
        """The upload rate while slowed (bits/s), 0 when not slowed."""
        st = self._current()
        if time.time() >= float(st.get("slow_until", 0.0)):
            return 0.0
        return 1e6 * float(st.get("base_mbps", 0.0)) / max(float(st.get("factor", 1.0)), 1.0)


def write_fault(path: Path, **state: float) -> None:
    """The launcher's side: replace the learner's fault state (atomically)."""
    old: dict[str, float] = {}
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**old, **state}))
    tmp.replace(path)
