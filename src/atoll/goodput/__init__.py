"""Datacenter-scale goodput simulator.

Where to look: the failure model is `failures`, the systems and constants `systems`, the
vectorised simulator `simulate`, its closed form `analytic`, the fit on the paper's
data-parallel rows `calibrate`, the command line `cli`.
"""

from atoll.goodput.analytic import expected_goodput
from atoll.goodput.failures import RecoveryDelay
from atoll.goodput.simulate import Result, simulate
from atoll.goodput.systems import Cluster, Constants, System, parse_system

__all__ = [
    "Cluster",
    "Constants",
    "RecoveryDelay",
    "Result",
    "System",
    "expected_goodput",
    "parse_system",
    "simulate",
]
