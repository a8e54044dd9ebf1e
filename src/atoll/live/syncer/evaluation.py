"""The global model's held-out loss while a live run goes: the syncer evaluates its own
values, as the virtual-time driver does, and says so in the event stream (`evaluated`), where
the terminal view, the status page, the report and the sinks read it.

When: at the same points as the virtual-time driver, fractions k/n of the token budget
(`model.eval_points`, so a live curve lies beside a simulated one), or every `every_s`
seconds when the run has no budget. What: the built-in model's `Evaluator` on its held-out
batches, or a custom model's function (`atoll syncer --eval-from MODULE:FUNCTION`).

The values are copied under the runtime's lock (one copy of the model); the evaluation runs
on its own guarded thread with no lock held, so rounds go on meanwhile. An evaluation that
raises is reported once on stderr and the run goes on without evaluations: a user's
evaluation function must not stop the run.

A shard holds only its own fragments: at each point it writes them (`part_dir`/point-K) and
the shard set's supervisor evaluates the model once every shard's part of point K is there
(shard_eval.py).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from atoll.core.budget import EvalPoints
from atoll.core.events import Evaluated
from atoll.threads import guarded

if TYPE_CHECKING:
    from atoll.live.syncer.runtime import SyncerRuntime

Evaluate = Callable[[dict[str, torch.Tensor]], float]


class LiveEvaluation:
    """Evaluates `rt`'s global values with `evaluate` at `points` fractions of the token
    budget (or every `every_s` seconds without one), on a guarded thread."""

    def __init__(
        self,
        rt: SyncerRuntime,
        evaluate: Evaluate | None,
        points: int,
        every_s: float = 60.0,
        part_dir: Path | None = None,
        budget: int | None = None,
    ) -> None:
        """`evaluate` None and `part_dir`: a shard's, writing its part of each point;
        `budget`: the run's token budget (default the syncer's: 0 on a shard but the home)."""
        self.rt, self.evaluate, self.part_dir = rt, evaluate, part_dir
        budget = rt.opts.token_budget if budget is None else budget
        self.points = EvalPoints(budget, points) if budget > 0 and points > 0 else None
        self.every_s = every_s
        self.point = 0  # the newest point reached (its index: k of n, or the k-th period)
        self._thread: threading.Thread | None = None
        self.failed: str | None = None

    def due(self, now: float) -> bool:
        """Whether a point was reached since the last call. Without a budget, point k is
        k periods after the run's start as the books keep it (restored on a restart): every
        shard of a set, and a restarted one, numbers the same instants alike."""
        with self.rt.lock:
            tokens, start = self.rt.books.total_tokens(), self.rt.acct["start"]
        if self.points is not None:
            passed = self.points.due(tokens)
            self.point += passed
            return passed > 0
        k = int((now - start) // self.every_s) if self.every_s > 0 else 0
        if k <= self.point:
            return False
        self.point = k
        return True

    def once(self) -> Evaluated | None:
        """Take the values now, evaluate them, record and return the event (None when this
        syncer has no evaluation left: a failed one stops the rest)."""
        if self.failed is not None:
            return None
        rt = self.rt
        with rt.lock:
            params = rt.proto.global_params()  # copies, of the fragments this syncer holds
            tokens, rounds = rt.books.total_tokens(), rt.proto.rounds_closed
        if self.evaluate is None:
            try:
                if self.part_dir is not None:
                    write_part(self.part_dir, self.point, params, tokens, rounds, rt)
            except OSError as exc:  # a full disk: this point is skipped, the next tried
                print(f"atoll syncer: evaluation part not written: {exc}", file=sys.stderr)
            return None
        e = evaluated(self, params, tokens, rounds)
        if e is None:
            return None
        rt.record(e)
        return e

    def _loop(self) -> None:
        while not self.rt.stopping.wait(0.5):
            if self.due(time.time()):
                self.once()
        if self.due(time.time()):  # a point reached as the syncer stopped (the budget's, often)
            self.once()

    def stop(self, timeout: float = 60.0) -> None:
        """Wait, once the syncer is stopping, for the thread's last look (bounded: a hung
        evaluation is not waited for past `timeout`)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def start(self) -> None:
        self._thread = guarded("live-evaluation", self._loop, self.rt.thread_died)
        self._thread.start()


def evaluated(owner: Any, params: dict, tokens: int, rounds: int) -> Evaluated | None:
    """`owner.evaluate(params)` (a LiveEvaluation, or a set's: shard_eval.py) as an
    `evaluated` record, or None when it raised: reported once on stderr, and `owner.failed`
    set (its evaluations end; the run goes on)."""
    t0 = time.perf_counter()
    try:
        loss = float(owner.evaluate(params))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a user's function (even sys.exit): reported
        owner.failed = repr(exc)[:500]
        print(f"atoll syncer: evaluation failed, no more live evaluations: {owner.failed}",
              file=sys.stderr, flush=True)  # fmt: skip
        return None
    return Evaluated(tokens, rounds, loss, round(time.perf_counter() - t0, 4))


def builtin_evaluate(scfg: object) -> Evaluate:
    """The built-in model's evaluator on the run's held-out batches, made at its first call
    (reading the corpus takes seconds: a syncer listens, a shard set starts its shards, first)."""
    from atoll.model.recipe import load_corpus
    from atoll.model.train import Evaluator

    made: list[Evaluate] = []

    def evaluate(params: dict) -> float:
        if not made:
            made.append(Evaluator(scfg, load_corpus(scfg)))  # type: ignore[arg-type]
        return made[0](params)

    return evaluate


def custom_evaluate(spec: str) -> Evaluate:
    """`MODULE:FUNCTION` returning the evaluation function (params by name -> loss), imported
    with the current directory on the path, as --init-from's."""
    from atoll.errors import ConfigError
    from atoll.model.custom import import_function

    make = import_function(spec, "eval-from")
    try:
        fn = make()
    except Exception as exc:
        raise ConfigError(
            "eval-from", spec, f"a function that returns (it raised {exc!r})"
        ) from exc
    if not callable(fn):
        raise ConfigError("eval-from", spec, "a function returning a callable(params) -> loss")
    return fn


def write_part(
    part_dir: Path, point: int, params: dict, tokens: int, rounds: int, rt: SyncerRuntime
) -> None:
    """A shard's own fragments' values at point `point` (written whole, then renamed)."""
    from safetensors.torch import save_file

    mine = {n for p in rt.proto.served for n in rt.plan.fragments[p].names}
    part_dir.mkdir(parents=True, exist_ok=True)
    tmp = part_dir / f"point-{point}.safetensors.tmp"
    meta = {"tokens": str(tokens), "rounds": str(rounds), "point": str(point)}
    save_file({k: v.contiguous() for k, v in params.items() if k in mine}, str(tmp), meta)
    tmp.replace(part_dir / f"point-{point}.safetensors")
