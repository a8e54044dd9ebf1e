"""Vectorised Monte Carlo simulation of one system on one cluster.

Each lock-step group (the data-parallel job, or one learner) alternates between running and
paused. Interruptions are Poisson, so the time to the next one is Exp(rate) whatever happened
before; an interruption that lands during a pause is absorbed by that pause. The run is
therefore a sequence of independent cycles, drawn all at once with numpy and laid end to end
with a cumulative sum (no Python loop over chips or interruptions). Every group yields running
segments (start, end, useful chip-speed per second); one sweep over all segments gives the
goodput, the uptime and the timeline, and enforces the quorum for Decoupled DiLoCo.

Cycles (see `atoll.goodput.systems` for the systems):
- dp: run U ~ Exp(rate), keep the work up to the last checkpoint, restart for restart_s.
- elastic, starting just after a down-scale with one slice out (recovery delay D):
  run r ~ Exp(rate) on chips - slice; if r < w = max(rejoin_wait_s, D) an interruption comes
  first: down-scale, start over. Otherwise up-scale at w, run b ~ Exp(rate) on all chips,
  then an interruption and a down-scale. (A slice still in recovery at the next down-scale is
  treated as rejoining then; it is 1 slice of the group, a negligible error unless a learner
  has only a few slices.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from atoll.goodput.failures import interruption_rate, sample_slowest
from atoll.goodput.systems import Cluster, Constants, System, validate

# start, end, useful chip-speed per second, and whether an interruption ended the segment
Segments = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Result:
    """What one simulated run gives.

    goodput: useful chip-time / allocated chip-time. uptime: fraction of time the system
    makes progress (for Decoupled: at least `quorum` learners running). interruptions:
    interruptions that stopped or shrank a running group; exposed_s: group-seconds of running
    during which they could happen (their ratio estimates the group's interruption rate).
    timeline_s / timeline_goodput: bin edges (seconds) and the goodput within each bin.
    """

    system: str
    chips: int
    horizon_s: float
    goodput: float
    uptime: float
    interruptions: int
    exposed_s: float
    timeline_s: np.ndarray
    timeline_goodput: np.ndarray


def _draw_cycles(
    draw: Callable[[int], tuple[np.ndarray, list[np.ndarray]]],
    mean_cycle_s: float,
    horizon_s: float,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Draw batches of cycles until their lengths add up past the horizon."""
    lengths: list[np.ndarray] = []
    columns: list[list[np.ndarray]] = []
    total = 0.0
    batch = int(1.2 * horizon_s / mean_cycle_s) + 16
    while total < horizon_s:
        length, cols = draw(batch)
        lengths.append(length)
        columns.append(cols)
        total += float(length.sum())
    return np.concatenate(lengths), [np.concatenate(c) for c in zip(*columns, strict=True)]


def dp_segments(
    chips: int, rate: float, c: Constants, speed: float, horizon_s: float, rng: np.random.Generator
) -> Segments:
    """Running segments of a non-elastic data-parallel job."""
    interval = np.sqrt(2.0 * c.checkpoint_cost_s / rate)  # Young/Daly checkpoint interval
    period = interval + c.checkpoint_cost_s

    def draw(n: int) -> tuple[np.ndarray, list[np.ndarray]]:
        up = rng.exponential(1.0 / rate, n)
        saved = interval * np.floor(up / period)
        return up + c.restart_s, [up, saved]

    length, (up, saved) = _draw_cycles(draw, 1.0 / rate + c.restart_s, horizon_s)
    start = np.concatenate([[0.0], np.cumsum(length)[:-1]])
    useful_rate = chips * speed * saved / np.maximum(up, 1e-300)
    return start, start + up, useful_rate, np.ones(len(up), dtype=bool)


def elastic_segments(
    chips: int, rate: float, c: Constants, speed: float, horizon_s: float, rng: np.random.Generator
) -> Segments:
    """Running segments of a slice-elastic job."""
    first = rng.exponential(1.0 / rate)  # starts with every slice in, until an interruption

    def draw(n: int) -> tuple[np.ndarray, list[np.ndarray]]:
        run = rng.exponential(1.0 / rate, n)
        wait = np.maximum(c.rejoin_wait_s, c.recovery.sample(rng, n))
        full = rng.exponential(1.0 / rate, n)
        hit = run < wait
        short = np.minimum(run, wait)
        full = np.where(hit, 0.0, full)
        length = short + c.downscale_s + np.where(hit, 0.0, c.upscale_s + full)
        return length, [short, full, hit]

    mean = min(1.0 / rate, c.rejoin_wait_s) + c.downscale_s
    length, (short, full, hit) = _draw_cycles(draw, mean, horizon_s)
    t0 = first + c.downscale_s
    start = t0 + np.concatenate([[0.0], np.cumsum(length)[:-1]])
    full_start = start + short + c.upscale_s
    starts = np.concatenate([[0.0], start, full_start[~hit]])
    ends = np.concatenate([[first], start + short, full_start[~hit] + full[~hit]])
    rates = np.concatenate(
        [
            [chips * speed],
            np.full(len(start), (chips - c.slice_chips) * speed),
            np.full(int((~hit).sum()), chips * speed),
        ]
    )
    ended = np.concatenate([[True], hit, np.ones(int((~hit).sum()), dtype=bool)])
    return starts, ends, rates, ended


def sweep(
    segments: Segments, quorum: int, horizon_s: float, chips: int, bins: int
) -> tuple[float, float, int, float, np.ndarray, np.ndarray]:
    """Integrate running segments: goodput, uptime, interruptions, exposed group-seconds and
    the timeline (bin edges, goodput per bin)."""
    start, end, rate, ended = segments
    interruptions = int(np.sum(ended & (end < horizon_s)))
    keep = start < horizon_s
    start, end, rate = start[keep], np.minimum(end[keep], horizon_s), rate[keep]
    rate = rate * np.where(end > start, 1.0, 0.0)  # clipping keeps the cycle's average rate
    exposed = float(np.sum(end - start))
    times = np.concatenate([start, end])
    order = np.argsort(times, kind="stable")
    times = times[order]
    level = np.cumsum(np.concatenate([rate, -rate])[order])
    count = np.cumsum(np.concatenate([np.ones_like(start), -np.ones_like(end)])[order])
    dt = np.diff(times)
    live = count[:-1] >= quorum - 0.5
    useful = np.where(live, np.maximum(level[:-1], 0.0), 0.0) * dt
    uptime = float(np.sum(dt[live])) / horizon_s
    cum = np.concatenate([[0.0], np.cumsum(useful)])
    edges = np.linspace(0.0, horizon_s, bins + 1)
    at_edges = np.interp(edges, times, cum, left=0.0, right=cum[-1])
    per_bin = np.diff(at_edges) / (chips * (horizon_s / bins))
    goodput = float(cum[-1]) / (chips * horizon_s)
    return goodput, uptime, interruptions, exposed, edges, per_bin


def simulate(
    system: System,
    cluster: Cluster,
    constants: Constants,
    horizon_s: float,
    seed: int = 0,
    bins: int = 240,
) -> Result:
    """Simulate `system` on `cluster` for `horizon_s` seconds. Deterministic given `seed`."""
    validate(cluster, system, constants)
    rng = np.random.default_rng(seed)
    groups = system.learners
    group_chips = cluster.chips // groups
    rate = interruption_rate(group_chips, cluster.mtbi_s)
    speeds = sample_slowest(rng, groups, group_chips, constants.speed_sigma)
    make = dp_segments if system.kind == "dp" else elastic_segments
    parts = [
        make(group_chips, rate, constants, float(speeds[g]), horizon_s, child)
        for g, child in enumerate(rng.spawn(groups))
    ]
    s, e, r, x = (np.concatenate(cols) for cols in zip(*parts, strict=True))
    goodput, uptime, interruptions, exposed, edges, per_bin = sweep(
        (s, e, r, x), system.quorum, horizon_s, cluster.chips, bins
    )
    return Result(
        system.name,
        cluster.chips,
        horizon_s,
        goodput,
        uptime,
        interruptions,
        exposed,
        edges,
        per_bin,
    )
