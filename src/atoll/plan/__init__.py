"""Capacity plan for the syncer (`atoll plan`): shards, cores, RAM and bandwidth from
measured rates. Formulas and their sources: `atoll.plan.model`."""

from atoll.plan.model import PlanConfig, plan, speedup, syncer_bytes_per_param

__all__ = ["PlanConfig", "plan", "speedup", "syncer_bytes_per_param"]
