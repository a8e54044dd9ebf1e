"""The one event stream. Every component emits `Event`s; metrics, logs and reports read them.

Kinds and their data fields:
    step            learner step finished: step, tokens, step_time (emitted by drivers, sampled)
    sent            learner sent fragment: fragment, seq, base_version, bytes, steps, tokens
    refused         syncer refused a contribution: learner, fragment, reason
    round_closed    syncer merged a fragment: fragment, version, participants [ids], weights,
                    staleness [rounds], quorum_wait_s, grace_s, bytes_in, bytes_out
    applied         learner applied a global fragment: fragment, version, mode
    blocked         learner waited for a fragment: fragment, wait_s
    failed          learner failed: lost_steps_s (work since its last send, lost)
    rejoined        learner healed and training again: downtime_s
    healed          learner loaded the global fragments: versions
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    t: float
    kind: str
    source: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
