"""The failure model: when chips are interrupted, how long they stay out, how fast they run.

- Interruptions are a Poisson process. Each chip is interrupted at rate 1 / MTBI, so a group of
  n chips is interrupted at rate n / MTBI (the cluster's mean time between interruptions falls
  as 1 / n: one year per chip on 1.2M chips is one interruption every 26 s).
- An interrupted chip takes its whole slice out for a recovery delay drawn from an
  exponentiated Weibull distribution, CDF F(x) = (1 - exp(-(x / scale)^c))^a, as in the paper.
- Chips run at slightly different speeds: speed ~ Normal(1, sigma), fixed per chip. A lock-step
  group (a data-parallel job, or one learner) runs at the speed of its slowest chip, so the
  others idle for the difference: the group's efficiency is min(speed) / 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

SECONDS_PER_YEAR = 365.0 * 86400.0


@dataclass(frozen=True)
class RecoveryDelay:
    """Exponentiated Weibull recovery delay, in seconds: CDF (1 - exp(-(x/scale)^c))^a.

    The defaults (median about 1 minute, a tail to tens of minutes) are atoll's assumption,
    not the paper's: its constants were not published. They are fixed, not fitted.
    """

    a: float = 2.0
    c: float = 0.8
    scale_s: float = 30.0

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Draw `size` delays by inverting the CDF."""
        u = rng.random(size)
        return self.scale_s * (-np.log1p(-(u ** (1.0 / self.a)))) ** (1.0 / self.c)

    def quantiles(self, n: int = 512) -> np.ndarray:
        """`n` evenly spaced quantiles (midpoints), for expectations by quadrature."""
        u = (np.arange(n) + 0.5) / n
        return self.scale_s * (-np.log1p(-(u ** (1.0 / self.a)))) ** (1.0 / self.c)


def interruption_rate(chips: int, mtbi_s: float) -> float:
    """Interruptions per second of a group of `chips` chips, each with MTBI `mtbi_s`."""
    return chips / mtbi_s


def expected_slowest(chips: int, sigma: float) -> float:
    """Expected speed of the slowest of `chips` chips with speed ~ Normal(1, sigma).

    Blom's approximation of the expected minimum of n normal draws; used by the analytic
    model. The simulator draws the speeds instead.
    """
    if sigma <= 0.0:
        return 1.0
    return float(1.0 + sigma * norm.ppf((1.0 - 0.375) / (chips + 0.25)))


def sample_slowest(
    rng: np.random.Generator, groups: int, chips_per_group: int, sigma: float
) -> np.ndarray:
    """Draw every chip's speed and return the slowest speed of each of `groups` groups."""
    if sigma <= 0.0:
        return np.ones(groups)
    speeds = rng.normal(1.0, sigma, size=(groups, chips_per_group)).astype(np.float32)
    return np.clip(speeds.min(axis=1).astype(np.float64), 0.0, None)
