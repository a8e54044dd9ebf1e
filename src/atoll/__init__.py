"""atoll: Decoupled DiLoCo for training one model across independent, failure-prone islands."""

__version__ = "0.1.0"
