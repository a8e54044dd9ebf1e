"""WAN bandwidth model: what data-parallel, DiLoCo, Streaming DiLoCo and Decoupled DiLoCo need.

All formulas are in `atoll.bandwidth.model`; the command line is `atoll bandwidth`.
"""

from atoll.bandwidth.model import (
    BandwidthConfig,
    average_rate,
    measured_vs_predicted,
    required_bandwidth,
    utilization,
)

__all__ = [
    "BandwidthConfig",
    "average_rate",
    "measured_vs_predicted",
    "required_bandwidth",
    "utilization",
]
