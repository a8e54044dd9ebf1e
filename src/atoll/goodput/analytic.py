"""Expected goodput in closed form (renewal-reward), for the same model the simulator runs.

Goodput = E[useful chip-time per cycle] / (chips * E[cycle length]). The simulator must agree
with these within its Monte Carlo noise (tested); calibration fits against these because they
are smooth and take microseconds.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import binom

from atoll.goodput.failures import expected_slowest, interruption_rate
from atoll.goodput.systems import Cluster, Constants, System, validate


def dp_goodput(chips: int, mtbi_s: float, c: Constants) -> float:
    """Non-elastic data parallel: keeps C * floor(U / (C + cost)) of an uptime U ~ Exp(rate)."""
    rate = interruption_rate(chips, mtbi_s)
    interval = np.sqrt(2.0 * c.checkpoint_cost_s / rate)
    q = np.exp(-rate * (interval + c.checkpoint_cost_s))
    saved = interval * q / (1.0 - q)  # E[floor(U / period)] = q / (1 - q)
    speed = expected_slowest(chips, c.speed_sigma)
    return float(speed * saved / (1.0 / rate + c.restart_s))


def elastic_cycle(chips: int, mtbi_s: float, c: Constants) -> tuple[float, float]:
    """Slice-elastic job: (goodput, fraction of time running)."""
    rate = interruption_rate(chips, mtbi_s)
    wait = np.maximum(c.rejoin_wait_s, c.recovery.quantiles())
    reach = float(np.mean(np.exp(-rate * wait)))  # P(no interruption before the rejoin)
    short = float(np.mean(-np.expm1(-rate * wait))) / rate  # E[min(run, wait)]
    length = short + c.downscale_s + reach * (c.upscale_s + 1.0 / rate)
    speed = expected_slowest(chips, c.speed_sigma)
    useful = speed * (short * (chips - c.slice_chips) + reach * chips / rate)
    return useful / (chips * length), (short + reach / rate) / length


def expected_goodput(system: System, cluster: Cluster, constants: Constants) -> float:
    """Expected goodput of `system` on `cluster` (the simulator's long-run limit)."""
    validate(cluster, system, constants)
    if system.kind == "dp":
        return dp_goodput(cluster.chips, cluster.mtbi_s, constants)
    chips = cluster.chips // system.learners
    goodput, running = elastic_cycle(chips, cluster.mtbi_s, constants)
    if system.quorum <= 1:
        return goodput
    # A learner's work counts when at least quorum - 1 of the others run too (independent).
    others = float(binom.sf(system.quorum - 2, system.learners - 1, running))
    return goodput * others
