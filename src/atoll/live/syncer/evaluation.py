"""The global model's held-out loss while a live run goes: the syncer evaluates its own
values, as the virtual-time driver does, and says so in the event stream (`evaluated`), where
the terminal view, the status page, the report and the sinks read it.

When: at the same points as the virtual-time driver, fractions k/n of the token budget
(`model.eval_points`, so a live curve lies beside a simulated one), or every `every_s`
seconds when the run has no budget. What: the built-in model's `Evaluator` on its held-out
batches, or a custom model's function (`atoll syncer --eval-from MODULE:FUNCTION`).

The values are copied under the runtime's lock (one copy of the model); the evaluation runs
on its own guarded thread with no lock held, so rounds go on meanwhile. An evaluation that
raises is recorded once as a `thread_died`-free warning line and the run goes on without
evaluations: a user's evaluation function must not stop the run.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from atoll.core.events import Evaluated
from atoll.sim.world import EvalPoints
from atoll.threads import guarded

if TYPE_CHECKING:
    from atoll.live.syncer.runtime import SyncerRuntime

Evaluate = Callable[[dict[str, torch.Tensor]], float]


class LiveEvaluation:
    """Evaluates `rt`'s global values with `evaluate` at `points` fractions of the token
    budget (or every `every_s` seconds without one), on a guarded thread."""

    def __init__(
        self, rt: SyncerRuntime, evaluate: Evaluate, points: int, every_s: float = 60.0
    ) -> None:
        self.rt, self.evaluate = rt, evaluate
        budget = rt.opts.token_budget
        self.points = EvalPoints(budget, points) if budget > 0 and points > 0 else None
        self.every_s = every_s
        self._last = time.time()
        self._thread: threading.Thread | None = None
        self.failed: str | None = None

    def due(self, now: float) -> bool:
        if self.points is not None:
            return self.points.due(self.rt.books.total_tokens()) > 0
        if self.every_s > 0 and now - self._last >= self.every_s:
            self._last = now
            return True
        return False

    def once(self) -> Evaluated | None:
        """Take the values now, evaluate them, record and return the event (None when this
        syncer has no evaluation left: a failed one stops the rest)."""
        if self.failed is not None:
            return None
        rt = self.rt
        with rt.lock:
            params = {k: v.detach().clone() for k, v in rt.proto.global_params().items()}
            tokens, rounds = rt.books.total_tokens(), rt.proto.rounds_closed
        t0 = time.perf_counter()
        try:
            loss = float(self.evaluate(params))
        except Exception as exc:  # a user's function: reported, and the run goes on
            self.failed = repr(exc)[:500]
            print(f"atoll syncer: evaluation failed, no more live evaluations: {self.failed}",
                  file=sys.stderr, flush=True)  # fmt: skip
            return None
        e = Evaluated(tokens, rounds, loss, round(time.perf_counter() - t0, 4))
        rt.record(e)
        return e

    def _loop(self) -> None:
        while not self.rt.stopping.wait(0.5):
            if self.due(time.time()):
                self.once()

    def start(self) -> None:
        self._thread = guarded("live-evaluation", self._loop, self.rt.thread_died)
        self._thread.start()


def builtin_evaluate(scfg: object) -> Evaluate:
    """The built-in model's evaluator on the run's held-out batches."""
    from atoll.model.recipe import load_corpus
    from atoll.model.train import Evaluator

    return Evaluator(scfg, load_corpus(scfg))  # type: ignore[arg-type]


def custom_evaluate(spec: str) -> Evaluate:
    """`MODULE:FUNCTION` returning the evaluation function (params by name -> loss), imported
    with the current directory on the path, as --init-from's."""
    from atoll.errors import ConfigError
    from atoll.model.custom import import_function

    make = import_function(spec, "eval-from")
    fn = make()
    if not callable(fn):
        raise ConfigError("eval-from", spec, "a function returning a callable(params) -> loss")
    return fn
