"""The live view of a run, read from its one event stream (events.jsonl), as `atoll run` and
`atoll demo` go: one row per learner (state, step, tokens/s, the last fragment it received,
its staleness in the last round, rejoins, bytes each way on the wire), then the run: rounds
closed, learners per round, goodput, bytes against the data-parallel equivalent, and a bar to
the token budget. The run's figures are metrics.Figures, the fold every surface reads (goodput
over the first join to the latest contribution taken: it holds while the run is idle or over).

`RunState` folds typed events (atoll.core.events) into those figures and decides nothing for
the run; `RunView` tails the file and shows them: a table redrawn in place (rich) when stdout
is a terminal, else one plain line every `line_every_s` seconds.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atoll import metrics
from atoll.core import events as ev
from atoll.core.events import FINISHED, Event

POLL_BYTES = 8 << 20  # of the event log read at one poll at most


@dataclass
class LearnerRow:
    state: str = "starting"
    ranks: int = 1  # the island's size
    step: int = 0
    tokens: int = 0
    tokens_per_s: float = 0.0
    last: str = "-"  # fragment@version of the newest update applied
    staleness: int | None = None  # in the newest round it took part in
    heals: int = 0  # the first is its join; each later one a rejoin
    reconnects: int = 0  # its communication side reconnected (without a restart)
    up: int = 0
    down: int = 0
    reported: bool = False  # its own step reports are in the log (else: what a syncer hears)
    _prev: tuple[float, int] | None = None  # (time, tokens) of the step report before

    @property
    def rejoins(self) -> int:
        return max(self.heals - 1, 0)


@dataclass
class RunState:
    """What the view shows, from the events seen so far."""

    learners: int
    token_budget: int = 0
    dp_bytes_per_token: float = 0.0  # a data-parallel ring all-reduce's bytes per token
    # per learner step, where tokens per step are not known (a custom model): each
    # learner's step one data-parallel worker's step
    dp_bytes_per_step: float = 0.0
    rows: dict[str, LearnerRow] = field(default_factory=dict)
    fig: metrics.Figures = field(default_factory=metrics.Figures)  # the run's figures
    participants: list[int] = field(default_factory=list)  # of the newest rounds
    started: float | None = None  # the first training step
    wire: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    steps: dict[tuple[str, str], int] = field(default_factory=dict)
    evals: list[tuple[int, float]] = field(default_factory=list)  # (tokens, held-out loss)
    _by_join: bool = False  # `started` is the first join, no training step seen yet

    def __post_init__(self) -> None:
        self.fig.learners = self.learners

    @property
    def rounds(self) -> int:
        return self.fig.rounds

    @property
    def last_accepted(self) -> float | None:
        return self.fig.last_accepted

    def row(self, learner: str) -> LearnerRow:
        return self.rows.setdefault(learner, LearnerRow())

    def _tokens(self, lid: str, incarnation: str, t: float, tokens: int) -> LearnerRow:
        """A learner incarnation's tokens at time `t` (a step report, or a beat the syncer
        heard), and its rate since the one before."""
        r = self.row(lid)
        if r._prev is not None and t > r._prev[0] and tokens >= r._prev[1]:
            r.tokens_per_s = (tokens - r._prev[1]) / (t - r._prev[0])
        r._prev = (t, tokens)
        r.tokens = tokens
        return r

    def heard(
        self, learners: list[dict[str, Any]], now: float, quiet_s: float, tokens: int | None = None
    ) -> None:
        """What a syncer hears of its learners (their beats' tokens and steps, the age of the
        last; what it took from and sent to each: syncer/roster.py), for learners whose own
        step reports are not in the log (learners elsewhere); `tokens`: the run's, as its
        books count them (the budget's count: it is the run's tokens from then on)."""
        if tokens is not None:
            self.fig.heard_tokens = tokens
        for x in learners:
            lid = x["id"]
            r = self.row(lid)
            r.state = "quiet" if x["age_s"] > quiet_s else "training"
            if r.reported:
                continue  # its own step reports are in the log: they are its figures
            key = f"{lid}/{x['incarnation']}"
            self.fig.tokens[key] = max(self.fig.tokens.get(key, 0), int(x["tokens"]))
            self._tokens(lid, x["incarnation"], now, int(x["tokens"]))
            r.tokens_per_s = float(x.get("tokens_per_s", r.tokens_per_s))  # the syncer's rate
            r.step = self.steps[(lid, "syncer")] = int(x.get("steps", 0))
            r.ranks, r.reconnects = int(x.get("ranks", 1)), int(x.get("reconnects", 0))
            r.up, r.down = int(x.get("bytes_in", 0)), int(x.get("bytes_out", 0))
            self.wire[(lid, "syncer")] = (r.up, r.down)
            r.last = x.get("last") or "-"
        if self.started is None and learners:
            self.started = now

    def feed(self, e: Event) -> None:
        self.fig.feed(e)
        match e.data:
            case ev.Evaluated() as d:
                self.evals.append((d.tokens, d.eval_loss))
            case ev.Step() as d:
                r = self._tokens(e.source, d.incarnation, e.t, d.tokens)
                r.step, r.state, r.reported = d.step, "training", True
                self.steps[(e.source, d.incarnation)] = d.step
                self.steps.pop((e.source, "syncer"), None)  # what the syncer said of it before
                self.wire.pop((e.source, "syncer"), None)
                if d.wire_up is not None:
                    self.wire[(e.source, d.incarnation)] = (d.wire_up, d.wire_down or 0)
                    r.up, r.down = d.wire_up, d.wire_down or 0
            case ev.Training() as d:
                first = self.started is None or self._by_join
                self.started = e.t if first else min(self.started, e.t)  # type: ignore[type-var]
                self._by_join = False
                r = self.row(e.source)
                r.state, r.ranks = "training", d.island
            case ev.Healed():
                self.row(e.source).heals += 1
            case ev.Reconnected():
                self.row(e.source).reconnects += 1
            case ev.Applied() as d:
                self.row(e.source).last = f"{d.fragment}@{d.version}"
            case ev.RoundClosed() as d:
                self.participants = [*self.participants[-49:], len(d.participants)]
                for lid, s in zip(d.participants, d.staleness, strict=False):
                    self.row(lid).staleness = s
            case ev.Lost() as d:
                self.row(d.learner).state = "finished" if d.why == FINISHED else "lost"
            case ev.Joined() as d:
                self.row(d.learner).state = "joined"
                if self.started is None:  # until a training step is seen (learners logging
                    self.started, self._by_join = e.t, True  # elsewhere: never)
            case ev.Chaos() as d if d.process in self.rows:
                shown = {"kill": "killed", "stall": "stalled"}
                self.row(d.process).state = shown.get(d.action, d.action)

    # -- the run's figures --------------------------------------------------------------------
    def total_tokens(self) -> int:
        return self.fig.total_tokens()

    def goodput(self, now: float | None = None) -> float | None:
        """metrics.Figures' goodput (`now` is not used: the figure holds while idle); None
        before the first contribution."""
        return None if not self.fig.window_s() else self.fig.goodput()

    def bytes_ratio(self) -> tuple[int, float]:
        """(bytes on the wire both ways, data-parallel's bytes for the same tokens)."""
        wire = sum(u + d for u, d in self.wire.values())
        if self.dp_bytes_per_token:
            return wire, self.dp_bytes_per_token * self.total_tokens()
        return wire, self.dp_bytes_per_step * sum(self.steps.values())

    def line(self, now: float) -> str:
        """The run in one plain line."""
        g = self.goodput(now)
        wire, dp = self.bytes_ratio()
        per = sum(self.participants) / len(self.participants) if self.participants else 0.0
        live = sum(1 for r in self.rows.values() if r.state == "training")
        budget = f"/{self.token_budget:,}" if self.token_budget else ""
        dp_mb = f"{dp / 1e6:.0f} MB" if self.dp_bytes_per_token or self.dp_bytes_per_step else "-"
        return (
            f"tokens {self.total_tokens():,}{budget}  rounds {self.rounds}  "
            f"learners/round {per:.2f}  training {live}/{self.learners}  "
            f"goodput {'-' if g is None else f'{g:.1%}'}  "
            f"received {self.fig.received_bytes / 1e6:.2f} MB  "
            f"wire {wire / 1e6:.1f} MB (data-parallel {dp_mb})  eval {self.eval_text()}"
        )

    def eval_text(self) -> str:
        """The latest held-out loss of the global model, and the tokens it was taken at."""
        if not self.evals:
            return "-"
        tokens, loss = self.evals[-1]
        return f"{loss:.4f} at {tokens:,} tokens"


def render(state: RunState, now: float, title: str = "atoll run") -> Any:
    """The table and the run's line, as one rich renderable."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    t = Table(title=title, expand=False)
    for col in ("learner", "state", "ranks", "step", "tokens/s", "last update", "staleness",
                "rejoins", "reconnects", "up MB", "down MB"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("learner", "state") else "right")
    colour = {"training": "green", "lost": "red", "killed": "red"}
    colour |= {"stalled": "yellow", "quiet": "yellow"}
    for lid in sorted(state.rows):
        r = state.rows[lid]
        st = f"[{colour.get(r.state, 'white')}]{r.state}[/]"
        stale = "-" if r.staleness is None else str(r.staleness)
        counts = (r.ranks, r.step, f"{r.tokens_per_s:,.0f}", r.last, stale, r.rejoins,
                  r.reconnects, f"{r.up / 1e6:.2f}", f"{r.down / 1e6:.2f}")  # fmt: skip
        t.add_row(lid, st, *map(str, counts))
    parts: list[Any] = [t, state.line(now)]
    if state.token_budget:
        done = min(state.total_tokens(), state.token_budget)
        parts.append(ProgressBar(total=state.token_budget, completed=done, width=60))
    parts.append(f"eval loss (global model, held out): {state.eval_text()}")
    return Group(*parts)


class RunView:
    """Tails `events_path` and shows the run: a live table on a terminal, else a plain line
    every `line_every_s` seconds (`out`: where; default stdout)."""

    def __init__(
        self,
        events_path: Path,
        state: RunState,
        out: Any = None,
        refresh_s: float = 1.0,
        line_every_s: float = 5.0,
        display: bool = True,
        sinks: list | None = None,
        hear: Callable[[RunState, float], None] | None = None,
    ) -> None:
        """`display` False: nothing on the console (the sinks are still fed; one that fails
        is said once and dropped: atoll.sinks.feed); `hear`: a second source, called at each
        poll (a syncer's learners as it hears them)."""
        from rich.console import Console

        self.path, self.state = Path(events_path), state
        self.display, self.sinks, self.hear = display, list(sinks or []), hear
        self.console = Console(file=out or sys.stdout)
        self.refresh_s, self.line_every_s = refresh_s, line_every_s
        self._pos, self._rest, self._shown = 0, "", 0.0
        self._live: Any = None
        self.title = "atoll run"
        self._evals_sent, self._step = 0, 0  # held-out losses sent; the sinks' last step
        self._broken = False

    def poll(self) -> None:
        """Take the lines written since the last poll (a torn last line waits)."""
        if self.hear is not None:
            self.hear(self.state, time.time())
        if not self.path.exists():
            return
        with open(self.path) as fh:
            fh.seek(self._pos)
            chunk = fh.read(POLL_BYTES)  # a long run's log: the rest at the next polls
            self._pos = fh.tell()
        lines = (self._rest + chunk).split("\n")
        self._rest = lines.pop()
        for line in lines:
            try:
                self.state.feed(Event.from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue

    def start(self) -> None:
        if self.display and self.console.is_terminal:
            from rich.live import Live

            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.start()

    def tick(self, now: float | None = None) -> None:
        """Show the run when due; the view failing (a render, the log) is said once and the
        view ends: the run it watches goes on."""
        if not self._broken:
            try:
                self._tick(now)
            except Exception as exc:
                self._break(exc)

    def _break(self, exc: Exception) -> None:
        self._broken = True
        print(f"atoll: the live view stopped ({exc!r}); the run goes on", file=sys.stderr,
              flush=True)  # fmt: skip
        live, self._live = self._live, None
        if live is not None:
            try:
                live.stop()
            except Exception:  # noqa: BLE001 - the terminal is the view's; it is given up
                pass

    def _tick(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        every = self.refresh_s if self._live is not None else self.line_every_s
        if now - self._shown < every:
            return
        self.poll()
        if self.state.started is None:
            return  # nothing to show before training starts: ask again at the next tick
        self._shown = now
        self._feed_sinks(now)
        if self._live is not None:
            self._live.update(render(self.state, now, self.title))
        elif self.display:
            self._print_line(now)

    def _print_line(self, now: float) -> None:
        line = f"[{self.title}] {self.state.line(now)}"
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _feed_sinks(self, now: float) -> None:
        if self.sinks and self.state.started is not None:
            from atoll.sinks import feed, scalars

            # the figures now at the run's tokens, and each held-out loss once at its own
            # tokens as the run reaches them; the steps never go down (W&B drops a step below
            # the last), so a loss whose tokens lie behind the last step goes at that step
            total = self.state.total_tokens()
            self._eval_steps(total)
            self._step = max(self._step, total)
            feed(self.sinks, self._step, scalars(self.state, now))

    def _eval_steps(self, upto: int | None) -> None:
        """The held-out losses not yet sent whose tokens are at most `upto` (None: all)."""
        from atoll.sinks import feed

        for tokens, loss in self.state.evals[self._evals_sent :]:
            if upto is not None and tokens > upto:
                break
            self._step = max(self._step, tokens)
            feed(self.sinks, self._step, {"run/eval_loss": loss})
            self._evals_sent += 1

    def stop(self) -> None:
        """The last figures, to the console and the sinks: the training window ends at the
        last contribution taken, as the run's summary counts it."""
        if not self._broken:
            try:
                self._stop()
            except Exception as exc:
                self._break(exc)

    def _stop(self) -> None:
        self.poll()
        end = self.state.last_accepted or time.time()
        self._feed_sinks(end)
        if self._live is not None:
            self._live.update(render(self.state, end, self.title))
            self._live.stop()
            self._live = None
        elif self.display and self.state.started is not None:
            self._print_line(end)  # the last figures, also on a pipe

    def close_sinks(self, eval_loss: float | None = None) -> None:
        """The run's eval loss (once the summary has it) to the sinks, then close them."""
        from atoll.sinks import close_all, feed

        self._eval_steps(None)
        if eval_loss is not None and eval_loss == eval_loss:  # not NaN
            step = max(self._step, self.state.total_tokens())
            feed(self.sinks, step, {"run/eval_loss": eval_loss})
        close_all(self.sinks)


def view_for(
    run_dir: Path,
    scfg: Any,
    learners: int,
    display: bool = True,
    sinks: list | None = None,
    plan: Any = None,
    events: Path | None = None,
    per_step: bool = False,
) -> RunView:
    """The view of a run with settings `scfg`: its token budget, and what a data-parallel ring
    all-reduce of fp32 gradients would send per token (of the built-in model, or of `plan`'s
    model at the settings' batch and context), or with `per_step` per learner step (a custom
    model, whose tokens per step are the learners')."""
    from atoll.bandwidth.model import allreduce_factor
    from atoll.model.recipe import builtin_plan

    plan = plan if plan is not None else builtin_plan(scfg)[0]
    step = allreduce_factor("ring", learners) * plan.nbytes_fp32()
    if per_step:
        state = RunState(learners, scfg.budget_tokens(), dp_bytes_per_step=step)
    else:
        state = RunState(learners, scfg.budget_tokens(), step / (scfg.batch * scfg.context))
    path = events if events is not None else Path(run_dir) / "events.jsonl"
    return RunView(path, state, display=display, sinks=sinks)
