"""Baselines in the same virtual-time world (same data, init, step times, failures, links;
a chaos scenario's kill, stall and cut of a worker count as its failures).

data_parallel: one model; each step every worker computes on its own batch (the global batch
    is their concatenation), then a ring all-reduce of all fp32 gradients runs at the link
    bandwidth. Step time = slowest worker + all-reduce. Any failure stops everyone until the
    failed worker is back; the step in progress is lost.
sync_diloco: M learners each take H inner steps, then a barrier: ring all-reduce of the outer
    gradients (`sync_codec`), plain mean, the same outer optimizer as Decoupled. A failure
    stalls the barrier until the learner is back and has redone its inner steps.

Goodput, as for Decoupled: worker time spent on steps whose work reached the model, over
M * wall time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from atoll.bandwidth.model import ring_allreduce_bytes
from atoll.config import SimConfig
from atoll.core import codec
from atoll.core.budget import EvalPoints
from atoll.core.outer import OuterOptimizer, OuterState
from atoll.model.data import TokenCorpus
from atoll.model.recipe import load_corpus, new_model
from atoll.model.train import DataStream, Evaluator, inner_lr, new_inner_optimizer, train_step
from atoll.sim.world import (
    FailureSchedule,
    ProgressFn,
    RunResult,
    StepClock,
    dp_equivalent_bytes,
    ring_allreduce_time,
    timeline,
)


class _WithOutages:
    """A worker's failure schedule with the chaos scenario's outages of it merged in."""

    def __init__(self, sched: FailureSchedule, outages: list[tuple[float, float]]) -> None:
        self.sched, self.outages = sched, sorted(outages)
        self.head = sched.next()

    def next(self) -> tuple[float, float] | None:
        if self.outages and (self.head is None or self.outages[0][0] < self.head[0]):
            return self.outages.pop(0)
        out = self.head
        if out is not None:
            self.head = self.sched.next()
        return out


class _Failures:
    """The union of all workers' failure schedules, as (fail_at, back_at) windows. A chaos
    scenario's kill, stall and cut of a worker stop it (and so everyone) the same way; its
    slow, add, remove and kill_syncer faults have no counterpart here and are not applied."""

    def __init__(self, cfg: SimConfig) -> None:
        self.scheds: list = [FailureSchedule(cfg, i) for i in range(cfg.learners)]
        for f in timeline(cfg):
            if f.kind in ("kill", "stall", "cut"):
                i = int(f.target[1:])
                if not isinstance(self.scheds[i], _WithOutages):
                    self.scheds[i] = _WithOutages(self.scheds[i], [])
                self.scheds[i].outages.append((f.at, f.end))
        self.next = [s.next() for s in self.scheds]
        self.count = 0

    def first_in(self, start: float, end: float) -> tuple[int, float, float] | None:
        """The earliest failure starting in [start, end), consumed; (worker, fail, back)."""
        best = None
        for i, nx in enumerate(self.next):
            while nx is not None and nx[1] <= start:  # entirely in the past (while stalled)
                nx = self.next[i] = self.scheds[i].next()
            if nx is not None and nx[0] < end and (best is None or nx[0] < best[1]):
                best = (i, max(nx[0], start), nx[1])
        if best is not None:
            self.next[best[0]] = self.scheds[best[0]].next()
            self.count += 1
        return best


class _Run:
    """What both baselines share: the checked settings, the workers (data streams, step
    clocks, the shared failure schedule), the links, and the tally: virtual time `t`, worker
    time spent useful, lost and down, tokens, the evaluation curve."""

    def __init__(
        self, cfg: SimConfig, corpus: TokenCorpus | None, progress: ProgressFn | None
    ) -> None:
        self.cfg = cfg = cfg.validate()
        torch.set_num_threads(cfg.threads)
        corpus = corpus if corpus is not None else load_corpus(cfg)
        self.evaluate = Evaluator(cfg, corpus)
        self.streams = [DataStream(cfg, corpus, i) for i in range(cfg.learners)]
        self.clocks = [StepClock(cfg, i) for i in range(cfg.learners)]
        self.failures = _Failures(cfg)
        self.bw, self.lat = cfg.bandwidth_mbps * 1e6, cfg.latency_ms / 1e3
        self.progress = progress
        self.t = self.useful = self.lost = self.down = 0.0
        self.tokens, self.budget = 0, cfg.budget_tokens()
        self.curve: list[dict[str, float]] = []
        self.eval_points = EvalPoints(self.budget, cfg.eval_points)

    def step_done(self, params: Callable[[], dict[str, torch.Tensor]]) -> None:
        """After a step (data-parallel) or a round (DiLoCo): progress, and the held-out
        evaluation of `params()` at each evaluation point the tokens have reached."""
        if self.progress:
            self.progress(min(self.tokens, self.budget), self.budget)
        due = self.eval_points.due(self.tokens)
        if due:
            loss, t, tokens = self.evaluate(params()), self.t, self.tokens
            self.curve += [{"tokens": tokens, "time_s": t, "eval_loss": loss} for _ in range(due)]

    def result(self, name: str, method: str, sent: int, model_bytes: int, rounds: int) -> RunResult:
        """The run's result: `sent` bytes each way in all, `rounds` all-reduces of all M."""
        cfg, t = self.cfg, self.t
        return RunResult(
            name=name,
            method=method,
            eval_loss=self.curve[-1]["eval_loss"],
            tokens=self.tokens,
            wall_time_s=t,
            goodput=self.useful / (cfg.learners * t),
            bytes_up=sent,
            bytes_down=sent,
            dp_bytes=dp_equivalent_bytes(cfg, self.tokens, model_bytes),
            rounds=rounds,
            participants_mean=float(cfg.learners),
            participants_hist={str(cfg.learners): rounds},
            down_s=self.down,
            lost_work_s=self.lost,
            failures=self.failures.count,
            curve=self.curve,
            blocked_s=cfg.learners * t - self.useful - self.lost - self.down,
        )


def run_data_parallel(
    cfg: SimConfig,
    name: str = "data_parallel",
    progress: ProgressFn | None = None,
    corpus: TokenCorpus | None = None,
) -> RunResult:
    run = _Run(cfg, corpus, progress)
    cfg = run.cfg
    model = new_model(cfg)
    opt = new_inner_optimizer(model, cfg)
    nbytes = 4 * sum(p.numel() for p in model.parameters())
    comm = ring_allreduce_time(nbytes, cfg.learners, run.bw, run.lat)
    step = 0
    while run.tokens < run.budget:
        times = [c.draw() for c in run.clocks]
        span = max(times) + comm
        hit = run.failures.first_in(run.t, run.t + span)
        if hit is not None:
            _, fail_at, back_at = hit
            run.lost += sum(min(x, fail_at - run.t) for x in times)
            run.down += cfg.learners * (back_at - fail_at)
            run.t = back_at
            continue
        batches = [s.next() for s in run.streams]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        train_step(model, opt, (x, y), inner_lr(cfg, step))
        step += 1
        run.tokens += x.numel()
        run.t += span
        run.useful += sum(times)
        run.step_done(lambda: dict(model.named_parameters()))
    sent = step * cfg.learners * ring_allreduce_bytes(nbytes, cfg.learners)
    return run.result(name, "data_parallel", sent, nbytes, step)


def run_sync_diloco(
    cfg: SimConfig,
    name: str = "sync_diloco",
    progress: ProgressFn | None = None,
    corpus: TokenCorpus | None = None,
) -> RunResult:
    run = _Run(cfg, corpus, progress)
    cfg = run.cfg
    global_model = new_model(cfg)
    names = [n for n, _ in global_model.named_parameters()]
    theta = torch.cat([p.detach().reshape(-1) for p in global_model.parameters()])
    models = [new_model(cfg) for _ in range(cfg.learners)]
    opts = [new_inner_optimizer(m, cfg) for m in models]
    outer = OuterOptimizer(cfg.outer, cfg.outer_lr, cfg.outer_momentum, cfg.outer_delay)
    ostate = OuterState()
    sent = rounds = local_steps = 0

    def params() -> dict[str, torch.Tensor]:  # the global model's, by name
        return dict(zip(names, _unflatten(theta, global_model), strict=True))

    while run.tokens < run.budget:
        remaining = -(-(run.budget - run.tokens) // (cfg.learners * cfg.batch * cfg.context))
        h = min(cfg.H, remaining)
        durations = [sum(c.draw() for _ in range(h)) for c in run.clocks]
        finish = [run.t + d for d in durations]
        # failures during the inner phase: that learner redoes its inner steps after recovery
        while True:
            hit = run.failures.first_in(run.t, max(finish))
            if hit is None:
                break
            i, fail_at, back_at = hit
            if fail_at >= finish[i]:  # failed while idle at the barrier: back before it closes
                finish = [max(f, back_at) for f in finish]
                run.down += back_at - fail_at
                continue
            run.lost += fail_at - (finish[i] - durations[i])
            run.down += back_at - fail_at
            finish[i] = back_at + durations[i]
        deltas, frame_bytes = [], 0
        for i, m in enumerate(models):
            with torch.no_grad():
                for p, v in zip(m.parameters(), _unflatten(theta, m), strict=True):
                    p.copy_(v)
            for k in range(h):
                batch = run.streams[i].next()
                train_step(m, opts[i], batch, inner_lr(cfg, local_steps + k))
                run.tokens += batch[0].numel()
            local = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
            frame = codec.encode(theta - local, cfg.sync_codec, cfg.group)
            frame_bytes = max(frame_bytes, len(frame))
            deltas.append(codec.decode(frame))
        local_steps += h
        sent += cfg.learners * ring_allreduce_bytes(frame_bytes, cfg.learners)
        delta = torch.stack(deltas).mean(0)
        theta = outer.step(theta, delta, ostate)
        run.useful += sum(durations)
        run.t = max(finish) + ring_allreduce_time(frame_bytes, cfg.learners, run.bw, run.lat)
        rounds += 1
        run.step_done(params)
    return run.result(name, "sync_diloco", sent, 4 * theta.numel(), rounds)


def _unflatten(flat: torch.Tensor, like: torch.nn.Module) -> list[torch.Tensor]:
    sizes = [p.numel() for p in like.parameters()]
    return [v.view_as(p) for v, p in zip(flat.split(sizes), like.parameters(), strict=True)]
