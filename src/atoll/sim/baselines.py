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

import torch

from atoll.config import SimConfig
from atoll.core import codec
from atoll.core.outer import OuterOptimizer, OuterState
from atoll.model.data import ByteCorpus
from atoll.model.recipe import load_corpus, new_model
from atoll.model.train import DataStream, Evaluator, inner_lr, new_inner_optimizer
from atoll.sim.world import (
    EvalPoints,
    FailureSchedule,
    ProgressFn,
    RunResult,
    StepClock,
    dp_equivalent_bytes,
    ring_allreduce_bytes,
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


def _curve_points(curve: list, due: int, tokens: int, t: float, loss: float) -> None:
    curve += [{"tokens": tokens, "time_s": t, "eval_loss": loss} for _ in range(due)]


def _workers(
    cfg: SimConfig, corpus: ByteCorpus
) -> tuple[list[DataStream], list[StepClock], _Failures]:
    """Each worker's data stream and step clock, and the shared failure schedule."""
    streams = [DataStream(cfg, corpus, i) for i in range(cfg.learners)]
    clocks = [StepClock(cfg, i) for i in range(cfg.learners)]
    return streams, clocks, _Failures(cfg)


def _prepare(cfg: SimConfig, corpus: ByteCorpus | None) -> tuple[SimConfig, ByteCorpus, Evaluator]:
    """Checked settings, the corpus (the caller's if it has it, else read now), an evaluator."""
    cfg = cfg.validate()
    torch.set_num_threads(cfg.threads)
    corpus = corpus if corpus is not None else load_corpus(cfg)
    return cfg, corpus, Evaluator(cfg, corpus)


def run_data_parallel(
    cfg: SimConfig,
    name: str = "data_parallel",
    progress: ProgressFn | None = None,
    corpus: ByteCorpus | None = None,
) -> RunResult:
    cfg, corpus, evaluate = _prepare(cfg, corpus)
    model = new_model(cfg)
    opt = new_inner_optimizer(model, cfg)
    streams, clocks, failures = _workers(cfg, corpus)
    nbytes = 4 * sum(p.numel() for p in model.parameters())
    bw, lat = cfg.bandwidth_mbps * 1e6, cfg.latency_ms / 1e3
    comm = ring_allreduce_time(nbytes, cfg.learners, bw, lat)
    t = useful = lost = down = 0.0
    tokens, budget, step = 0, cfg.token_budget(), 0
    curve: list = []
    eval_points = EvalPoints(budget, cfg.eval_points)
    while tokens < budget:
        times = [c.draw() for c in clocks]
        span = max(times) + comm
        hit = failures.first_in(t, t + span)
        if hit is not None:
            _, fail_at, back_at = hit
            lost += sum(min(x, fail_at - t) for x in times)
            down += cfg.learners * (back_at - fail_at)
            t = back_at
            continue
        batches = [s.next() for s in streams]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        for g in opt.param_groups:
            g["lr"] = inner_lr(cfg, step)
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens += x.numel()
        t += span
        useful += sum(times)
        if progress:
            progress(min(tokens, budget), budget)
        due = eval_points.due(tokens)
        if due:
            _curve_points(curve, due, tokens, t, evaluate(dict(model.named_parameters())))
    per_worker = ring_allreduce_bytes(nbytes, cfg.learners)
    return RunResult(
        name=name,
        method="data_parallel",
        eval_loss=curve[-1]["eval_loss"],
        tokens=tokens,
        wall_time_s=t,
        goodput=useful / (cfg.learners * t),
        bytes_up=step * cfg.learners * per_worker,
        bytes_down=step * cfg.learners * per_worker,
        dp_bytes=dp_equivalent_bytes(cfg, tokens, nbytes),
        rounds=step,
        participants_mean=float(cfg.learners),
        participants_hist={str(cfg.learners): step},
        down_s=down,
        lost_work_s=lost,
        failures=failures.count,
        curve=curve,
        blocked_s=cfg.learners * t - useful - lost - down,
    )


def run_sync_diloco(
    cfg: SimConfig,
    name: str = "sync_diloco",
    progress: ProgressFn | None = None,
    corpus: ByteCorpus | None = None,
) -> RunResult:
    cfg, corpus, evaluate = _prepare(cfg, corpus)
    global_model = new_model(cfg)
    names = [n for n, _ in global_model.named_parameters()]
    theta = torch.cat([p.detach().reshape(-1) for p in global_model.parameters()])
    models = [new_model(cfg) for _ in range(cfg.learners)]
    opts = [new_inner_optimizer(m, cfg) for m in models]
    streams, clocks, failures = _workers(cfg, corpus)
    outer = OuterOptimizer(cfg.outer, cfg.outer_lr, cfg.outer_momentum, cfg.outer_delay)
    ostate = OuterState()
    bw, lat = cfg.bandwidth_mbps * 1e6, cfg.latency_ms / 1e3
    sent = 0
    t = useful = lost = down = 0.0
    tokens, budget, rounds, local_steps = 0, cfg.token_budget(), 0, 0
    curve: list = []
    eval_points = EvalPoints(budget, cfg.eval_points)
    while tokens < budget:
        remaining = -(-(budget - tokens) // (cfg.learners * cfg.batch * cfg.context))
        h = min(cfg.H, remaining)
        durations = [sum(c.draw() for _ in range(h)) for c in clocks]
        finish = [t + d for d in durations]
        # failures during the inner phase: that learner redoes its inner steps after recovery
        while True:
            hit = failures.first_in(t, max(finish))
            if hit is None:
                break
            i, fail_at, back_at = hit
            if fail_at >= finish[i]:  # failed while idle at the barrier: back before it closes
                finish = [max(f, back_at) for f in finish]
                down += back_at - fail_at
                continue
            lost += fail_at - (finish[i] - durations[i])
            down += back_at - fail_at
            finish[i] = back_at + durations[i]
        for m in models:
            with torch.no_grad():
                for p, v in zip(
                    m.parameters(), theta.split([q.numel() for q in m.parameters()]), strict=True
                ):
                    p.copy_(v.view_as(p))
        deltas, frame_bytes = [], 0
        for i, m in enumerate(models):
            for k in range(h):
                x, y = streams[i].next()
                for g in opts[i].param_groups:
                    g["lr"] = inner_lr(cfg, local_steps + k)
                loss = m(x, y)
                loss.backward()
                opts[i].step()
                opts[i].zero_grad(set_to_none=True)
                tokens += x.numel()
            local = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
            frame = codec.encode(theta - local, cfg.sync_codec, cfg.group)
            frame_bytes = max(frame_bytes, len(frame))
            deltas.append(codec.decode(frame))
        local_steps += h
        per_worker = ring_allreduce_bytes(frame_bytes, cfg.learners)
        sent += cfg.learners * per_worker
        delta = torch.stack(deltas).mean(0)
        theta = outer.step(theta, delta, ostate)
        useful += sum(durations)
        t = max(finish) + ring_allreduce_time(frame_bytes, cfg.learners, bw, lat)
        rounds += 1
        if progress:
            progress(min(tokens, budget), budget)
        due = eval_points.due(tokens)
        if due:
            params = dict(zip(names, _unflatten(theta, global_model), strict=True))
            _curve_points(curve, due, tokens, t, evaluate(params))
    return RunResult(
        name=name,
        method="sync_diloco",
        eval_loss=curve[-1]["eval_loss"],
        tokens=tokens,
        wall_time_s=t,
        goodput=useful / (cfg.learners * t),
        bytes_up=sent,
        bytes_down=sent,
        dp_bytes=dp_equivalent_bytes(cfg, tokens, 4 * theta.numel()),
        rounds=rounds,
        participants_mean=float(cfg.learners),
        participants_hist={str(cfg.learners): rounds},
        down_s=down,
        lost_work_s=lost,
        failures=failures.count,
        curve=curve,
        blocked_s=cfg.learners * t - useful - lost - down,
    )


def _unflatten(flat: torch.Tensor, like: torch.nn.Module) -> list[torch.Tensor]:
    sizes = [p.numel() for p in like.parameters()]
    return [v.view_as(p) for v, p in zip(flat.split(sizes), like.parameters(), strict=True)]
