"""The learner protocol's durable state (`LearnerProtocol.state_dict` / `load_state_dict`):
plain values and copies of its tensors. A base that is its latest value (one tensor in the
protocol) is one tensor in the state too, and again after a load."""

from __future__ import annotations

from typing import Any

from atoll.core.learner_types import Outstanding, Phase

LearnerProtocol = Any  # atoll.core.learner's (not imported: it imports this module)


def state_of(lp: LearnerProtocol) -> dict:
    latest = [t.clone() for t in lp.latest]
    base = [latest[p] if b is lp.latest[p] else b.clone() for p, b in enumerate(lp.base)]
    return {
        "step": lp.step,
        "seq": lp.seq,
        "generation": lp.generation,
        "healed": lp.healed,
        "phase": lp.phase.value,
        "budget": lp.budget.state_dict(),
        "step_time": lp.step_time.value,
        "work_s": lp.work_s,
        "unsent": list(lp.unsent),
        "counters": lp.counters.state_dict(),
        "base": base,
        "base_version": list(lp.base_version),
        "latest": latest,
        "latest_version": list(lp.latest_version),
        "outstanding": {p: r.state() for p, r in lp.outstanding.items()},
        "pulled": sorted(lp.pulled),
    }


def load_into(lp: LearnerProtocol, st: dict) -> None:
    if len(st["unsent"]) != lp.plan.P:
        raise ValueError(f"state has {len(st['unsent'])} fragments, the plan {lp.plan.P}")
    lp.step, lp.seq, lp.generation = st["step"], st["seq"], st["generation"]
    lp.step_time.value, lp.work_s = st["step_time"], st["work_s"]
    lp.phase = Phase(st.get("phase", Phase.RUNNING if st["healed"] else Phase.JOINING))
    lp.wait_since = 0.0
    lp.budget.load_state_dict(st.get("budget", {}))
    if lp.phase is Phase.WAITING:  # a wait does not outlive its process
        lp.phase = Phase.RUNNING
    lp.unsent = list(st["unsent"])
    lp.counters.load_state_dict(st["counters"])
    latest = lp.latest = [t.clone() for t in st["latest"]]
    lp.base = [latest[p] if b is st["latest"][p] else b.clone() for p, b in enumerate(st["base"])]
    lp.base_version = list(st["base_version"])
    lp.latest_version = list(st["latest_version"])
    lp.outstanding = {p: Outstanding.of(r) for p, r in st["outstanding"].items()}
    lp.pulled = set(st["pulled"])
