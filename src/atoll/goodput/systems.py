"""The systems being compared, the cluster they run on, and the constants of the model.

- ``dp``: one data-parallel job on every chip, no elasticity. Any interruption stops all
  chips; the job is rescheduled (on spare slices, so it does not wait for the broken one) in
  ``restart_s`` and resumes from its last checkpoint. It checkpoints at the Young/Daly interval
  sqrt(2 * checkpoint_cost_s * MTBI_cluster), paying ``checkpoint_cost_s`` per checkpoint.
- ``dp_elastic``: the same job with slice-level elasticity. An interruption pauses every chip
  for ``downscale_s`` (drop the slice, redo the interrupted step) and the job continues
  without that slice. A slice that has recovered rejoins at the next reconfiguration, or after
  ``rejoin_wait_s`` of running without one (whichever is first; never before it has
  recovered), which costs an up-scale pause of ``upscale_s``.
- ``decoupled_m{M}``: Decoupled DiLoCo, M learners, each an elastic job on chips / M chips. An
  interruption affects only its learner. Learners never wait for each other; their work counts
  while at least ``quorum`` learners are running (zero global downtime while the quorum holds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from atoll.errors import ConfigError
from atoll.goodput.failures import SECONDS_PER_YEAR, RecoveryDelay

SYSTEM_PATTERN = re.compile(r"^(dp|dp_elastic|decoupled_m(\d+))$")
ALLOWED_SYSTEMS = "dp, dp_elastic or decoupled_m<M> (M a positive integer, e.g. decoupled_m8)"
TABLE_SYSTEMS = (
    "dp",
    "dp_elastic",
    "decoupled_m2",
    "decoupled_m4",
    "decoupled_m8",
    "decoupled_m16",
)


# the timing constants the paper does not publish: fitted on the data-parallel rows
TIMING_CONSTANTS = (
    "restart_s",
    "checkpoint_cost_s",
    "downscale_s",
    "upscale_s",
    "rejoin_wait_s",
    "speed_sigma",
)


@dataclass(frozen=True)
class Constants:
    """Constants of the simulator. Times in seconds. See the module docstring for each one.

    The defaults of the timing constants are placeholders; `atoll.goodput.calibrate` fits them
    on the paper's two data-parallel rows and is what the CLI uses.
    """

    restart_s: float = 60.0
    checkpoint_cost_s: float = 1.0
    downscale_s: float = 20.0
    upscale_s: float = 15.0
    rejoin_wait_s: float = 60.0
    speed_sigma: float = 0.0
    slice_chips: int = 375
    recovery: RecoveryDelay = field(default_factory=RecoveryDelay)


@dataclass(frozen=True)
class System:
    """A parsed system name: ``kind`` is dp, dp_elastic or decoupled; ``learners`` is M."""

    name: str
    kind: str
    learners: int = 1
    quorum: int = 1


@dataclass(frozen=True)
class Cluster:
    """Chips allocated to the run and each chip's mean time between interruptions."""

    chips: int
    mtbi_s: float = SECONDS_PER_YEAR


def parse_system(name: str, quorum: int = 1) -> System:
    """Turn a system name into a `System`, or raise ConfigError naming what is allowed."""
    match = SYSTEM_PATTERN.match(name)
    if match is None:
        raise ConfigError("system", name, ALLOWED_SYSTEMS)
    if match.group(2) is None:
        if quorum != 1:
            raise ConfigError(
                "quorum", quorum, "1 for dp and dp_elastic (quorum is a Decoupled DiLoCo setting)"
            )
        return System(name=name, kind=name)
    learners = int(match.group(2))
    if learners < 1:
        raise ConfigError("system", name, ALLOWED_SYSTEMS)
    if not 1 <= quorum <= learners:
        raise ConfigError("quorum", quorum, f"an integer from 1 to M={learners}")
    return System(name=name, kind="decoupled", learners=learners, quorum=quorum)


def validate(cluster: Cluster, system: System, constants: Constants) -> None:
    """Check that the cluster can be cut into slices and learners; raise ConfigError if not."""
    if not isinstance(cluster.chips, int) or cluster.chips <= 0:
        raise ConfigError("chips", cluster.chips, "a positive integer")
    if not cluster.mtbi_s > 0:
        raise ConfigError("mtbi", cluster.mtbi_s, "a positive duration")
    if constants.slice_chips <= 0:
        raise ConfigError("slice_chips", constants.slice_chips, "a positive integer")
    if cluster.chips % constants.slice_chips:
        raise ConfigError(
            "chips", cluster.chips, f"a multiple of the slice size {constants.slice_chips}"
        )
    slices = cluster.chips // constants.slice_chips
    if slices % system.learners:
        raise ConfigError(
            "learners",
            system.learners,
            f"a divisor of the number of slices ({slices} slices of "
            f"{constants.slice_chips} chips), so every learner gets whole slices",
        )
    if slices // system.learners < 2 and system.kind != "dp":
        raise ConfigError("chips", cluster.chips, "at least 2 slices per elastic job or learner")
    for name in TIMING_CONSTANTS:
        value = getattr(constants, name)
        if not value >= 0:
            raise ConfigError(name, value, "a non-negative number")
    if constants.checkpoint_cost_s <= 0:
        raise ConfigError("checkpoint_cost_s", constants.checkpoint_cost_s, "a positive number")
