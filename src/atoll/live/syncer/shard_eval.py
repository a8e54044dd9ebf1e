"""A shard set's held-out evaluations while the run goes: each shard writes its own fragments'
values at each evaluation point (`RUN_DIR/shard-i/eval/point-K.safetensors`, evaluation.py),
and the set's supervisor, once every shard's part of point K is there, evaluates the whole
model and records `evaluated` in the set's event stream, as an unsharded syncer does.

Point K is the same fraction k/n of the token budget on every shard: each shard counts the
run's tokens from the learners' beats, which reach every shard. The tokens recorded are the
home shard's (shard 0 counts the budget), the rounds are every shard's summed. The parts of a
point are deleted once evaluated, and the parts of older points once a newer one is complete
(a shard that was down for a point never completes it).

The evaluation runs on its own thread, never in the supervision loop: a slow one delays no
restart. An evaluation that raises is reported once and ends the evaluations; the thread dying
otherwise takes the supervisor down loudly (exit 70), its shards with it.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from atoll.core.events import Evaluated
from atoll.eventlog import EventLog
from atoll.live.syncer.evaluation import Evaluate, evaluated
from atoll.threads import OnDeath, guarded

_PART = re.compile(r"point-(\d+)\.safetensors$")


def part_dir(shard_dir: Path) -> Path:
    return shard_dir / "eval"


# an incomplete point this far behind the newest one seen is dropped: a shard that was down for
# it, once back, writes the points its restored books have passed (they lag the others' a few),
# so a point only a little behind may still complete; this bounds the files a set keeps while a
# shard stays down (with a budget, the points are the eval_points only)
KEEP_BEHIND = 16


class SetEvaluation:
    def __init__(
        self,
        run_dir: Path,
        count: int,
        evaluate: Evaluate,
        events: EventLog,
        every_s: float = 0.5,
        on_death: OnDeath | None = None,
    ) -> None:
        """`on_death`: the set's, called if the thread dies of anything but the evaluation or
        the files (those are said and the thread goes on); default: the process exits 70."""
        self.dirs = [part_dir(run_dir / f"shard-{i}") for i in range(count)]
        self.evaluate, self.events, self.every_s = evaluate, events, every_s
        self.failed: str | None = None
        self.observers: list[Callable[[Evaluated], None]] = []  # each evaluation recorded
        self.stopping = threading.Event()
        self.on_death = on_death or _died
        self._thread: threading.Thread | None = None
        self._one = threading.Lock()  # one evaluation at a time
        self._said: set[str] = set()
        self._drop(self.parts(), None)  # an earlier run's parts: not this run's points

    def parts(self) -> dict[int, list[Path]]:
        """Point -> the shards' part files present (in shard order where complete)."""
        out: dict[int, list[Path]] = {}
        for d in self.dirs:
            for f in sorted(d.glob("point-*.safetensors")) if d.is_dir() else []:
                if m := _PART.search(f.name):
                    out.setdefault(int(m.group(1)), []).append(f)
        return out

    def once(self) -> Evaluated | None:
        """Evaluate the newest complete point, if any (None otherwise), and drop the parts
        no evaluation will read: that point's, older ones', incomplete ones KEEP_BEHIND
        behind the newest, and every one once the evaluations have failed."""
        with self._one:
            try:
                return self._once()
            except OSError as exc:  # a part's directory unreadable, a file not removable
                self._say(f"evaluation parts: {exc}")
                return None

    def _once(self) -> Evaluated | None:
        from safetensors import safe_open

        parts = self.parts()
        if self.failed is not None:  # the shards go on writing parts: none is kept
            self._drop(parts, None)
            return None
        done = [k for k, fs in parts.items() if len(fs) == len(self.dirs)]
        if not done:
            self._drop(parts, max(parts, default=0) - KEEP_BEHIND)
            return None
        k = max(done)
        params: dict = {}
        tokens, rounds = 0, 0
        try:
            for i, f in enumerate(parts[k]):
                with safe_open(str(f), "pt") as fh:
                    meta = fh.metadata() or {}
                    params.update({n: fh.get_tensor(n) for n in fh.keys()})  # noqa: SIM118
                rounds += int(meta.get("rounds", 0))
                tokens = int(meta.get("tokens", 0)) if i == 0 else tokens
        except Exception as exc:  # an unreadable part: this point is skipped
            self._say(f"evaluation point {k} skipped: {exc!r}")
            self._drop(parts, k)
            return None
        self._drop(parts, k)
        e = evaluated(self, params, tokens, rounds)
        if e is None:
            return None
        self.events.record("syncer", e)
        for observe in self.observers:  # the set's status page (shard_endpoints.py)
            observe(e)
        return e

    @staticmethod
    def _drop(parts: dict[int, list[Path]], k: int | None) -> None:
        """Point k's parts and every older point's (None: every point's)."""
        for old, fs in parts.items():
            if k is None or old <= k:
                for f in fs:
                    f.unlink(missing_ok=True)

    def _say(self, what: str) -> None:
        if what not in self._said:  # once each
            self._said.add(what)
            print(f"atoll syncer: {what}", file=sys.stderr, flush=True)

    def _loop(self) -> None:
        while True:
            stopped = self.stopping.wait(self.every_s)
            self.once()  # after the stop too: a point the shards wrote as they stopped
            if stopped:
                return

    def start(self) -> None:
        self._thread = guarded("set-evaluation", self._loop, self.on_death)
        self._thread.start()

    def stop(self, wait_s: float = 60.0) -> None:
        """Stop, after a last look at the parts; an evaluation still running after `wait_s`
        is not waited for (its thread ends with the process)."""
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(wait_s)
            if self._thread.is_alive():
                self._say(f"an evaluation still running after {wait_s:.0f} s: not waited for")


def _died(name: str, exc: BaseException) -> None:
    print(f"atoll syncer: the {name} thread died: {exc!r}; the shard set stops", file=sys.stderr,
          flush=True)  # fmt: skip
    os._exit(70)
