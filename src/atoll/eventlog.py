"""The run's event stream on disk: one JSON object per line in ``events.jsonl``.

Every process of a run (syncer, learners, launcher) appends to the same file; each line is one
``os.write`` on a descriptor opened with O_APPEND, so lines from different processes never
interleave. Events are atoll.core.events' typed records (t, kind, source, data), written with
`record`: a record of a kind not defined there cannot be made. The virtual-time driver writes
its streams with `write_events`; `load_events` reads either back as typed events.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from atoll.core.events import Event, Record


class EventLog:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._fd: int | None = None
        self._lock = threading.Lock()
        self.dropped = 0  # lines the disk refused
        self._warned_at = -1e9
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, source: str, data: Record, t: float | None = None) -> None:
        """Write one typed record (atoll.core.events) from `source`, stamped `t` (default:
        now)."""
        self.write(Event(time.time() if t is None else t, source, data))

    def write(self, event: Event) -> None:
        """Append one line. A disk that refuses it (full, read-only) costs the line, counted
        in `dropped` and said on stderr (at most every 10 s), never the caller: the tape, not
        the log, decides whether the syncer may go on (atoll.live.syncer.runtime)."""
        if self._fd is None:
            return
        line = json.dumps(event.to_dict(), default=_default, sort_keys=True) + "\n"
        with self._lock:
            try:
                os.write(self._fd, line.encode())
            except OSError as exc:
                self.dropped += 1
                now = time.monotonic()
                if now - self._warned_at >= 10.0:
                    self._warned_at = now
                    print(f"atoll: {self.path}: {exc}; {self.dropped} events not written",
                          file=sys.stderr, flush=True)  # fmt: skip

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _default(x: object) -> object:
    if isinstance(x, tuple | set):
        return list(x)
    return str(x)


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of an events.jsonl (a torn last line is skipped)."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def load_events(path: str | Path) -> list[Event]:
    """The events of an events.jsonl as typed records (atoll.core.events). Lines of a kind or
    with fields this atoll does not define (a log written by another version) are skipped."""
    out = []
    for d in read_events(path):
        try:
            out.append(Event.from_dict(d))
        except (KeyError, TypeError):
            continue
    return out


def write_events(path: str | Path, events: list[Event]) -> None:
    """Write a whole stream (the virtual-time driver's) in the same format."""
    with open(path, "w") as f:
        for e in events:
            f.write(json.dumps(e.to_dict(), sort_keys=True) + "\n")
