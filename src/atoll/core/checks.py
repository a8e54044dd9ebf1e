"""What the syncer checks before a contribution may touch any state.

Every refusal is a `Rejection(code, reason)`: a typed code (`messages.Refusal`, whose `action`
tells the learner to heal or rejoin) and a message naming the value and what is allowed. A
refused contribution leaves the syncer's state bit-identical. Both drivers use these checks;
the live driver adds only what is about its transport (protocol version, chunking, size).
"""

from __future__ import annotations

import math
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

import torch

from atoll.core import codec, intake
from atoll.core.fragments import FragmentPlan
from atoll.core.guard import MagnitudeGuard
from atoll.core.messages import Contribution, Refusal, Rejection

# Bounds on a header's numbers, far beyond any real run: a learner's bug must not be able to
# freeze the pull clock (a step time of 1e300), end the token budget, or outweigh every other
# learner in the merge (tokens^2/steps of 2^63 tokens).
STEP_TIME_MAX = 3600.0  # seconds per inner step
TOKENS_PER_STEP_MAX = 1 << 24  # tokens per inner step
STEPS_MAX = 1 << 31  # steps one contribution may cover


def check_numbers(c: Contribution) -> Rejection | None:
    """The header's numbers: finite and >= 0 times, counters within bounds."""
    for k in ("sent_at", "step_time", "work_s"):
        v = getattr(c, k)
        if not math.isfinite(v) or v < 0:
            return Rejection(Refusal.HEADER, f"{k}={v} is not a finite number >= 0")
    if c.step_time > STEP_TIME_MAX:
        return Rejection(
            Refusal.HEADER, f"step_time={c.step_time} s is beyond the bound of {STEP_TIME_MAX} s"
        )
    if c.base_version < 0:
        return Rejection(Refusal.HEADER, f"base version {c.base_version} is negative")
    if c.steps < 0 or c.tokens < 0:
        return Rejection(
            Refusal.COUNTERS, f"negative counters (steps={c.steps}, tokens={c.tokens})"
        )
    return check_counters(c.steps, c.tokens, c.work_s)


def check_counters(steps: int, tokens: int, work_s: float) -> Rejection | None:
    """Counters a learner reports (a contribution's, or a heartbeat's since it joined)."""
    if steps > STEPS_MAX or tokens > max(steps, 1) * TOKENS_PER_STEP_MAX:
        return Rejection(
            Refusal.COUNTERS,
            f"counters beyond bounds (steps={steps} <= {STEPS_MAX}, tokens={tokens} <= "
            f"{TOKENS_PER_STEP_MAX} per step)",
        )
    if work_s > max(steps, 1) * STEP_TIME_MAX:
        return Rejection(
            Refusal.COUNTERS,
            f"work_s={work_s} is beyond {STEP_TIME_MAX} s for each of {steps} steps",
        )
    return None


def check_contribution(
    c: Contribution,
    plan: FragmentPlan,
    live: Container[str],
    held: Container[int] | None,
    version: int,
    scheme: str = "",
) -> Rejection | None:
    """`held`: the base versions of fragment c.fragment the syncer still has; `scheme`: the
    codec the learners were told to use ('' accepts any)."""
    if not 0 <= c.fragment < plan.P:
        return Rejection(Refusal.FRAGMENT, f"fragment {c.fragment} out of range [0, {plan.P})")
    if c.learner not in live:
        return Rejection(Refusal.NOT_JOINED, f"learner {c.learner} has not joined")
    bad = check_numbers(c)
    if bad is not None:
        return bad
    if held is None or c.base_version not in held:
        return Rejection(
            Refusal.STALE_BASE,
            f"base version {c.base_version} of fragment {c.fragment} is not held "
            f"(current {version}); the learner must heal",
        )
    try:
        got, numel = codec.peek(c.payload)
    except codec.CodecError as exc:
        return Rejection(Refusal.PAYLOAD, f"bad payload: {exc}")
    if scheme and got != scheme:
        return Rejection(Refusal.PAYLOAD, f"codec {got}, this run uses {scheme}")
    want = plan.fragments[c.fragment].numel
    if numel != want:
        return Rejection(Refusal.PAYLOAD, f"fragment {c.fragment} has {want} values, got {numel}")
    return None


@dataclass(frozen=True)
class Decoded:
    """A contribution that passed every check: the learner's value (base - delta) and the
    magnitude guard's measure of its delta (recorded once it is accepted)."""

    theta: torch.Tensor
    rate: float


@dataclass
class Pending:
    """An accepted contribution waiting for its round: its values theta_m (a tensor, or its
    frame held: `fused.Held`), weight, message, staleness, bytes and arrival time."""

    theta: Any
    weight: float
    c: Contribution
    staleness: int
    nbytes: int
    arrived: float


def decode_checked(
    c: Contribution,
    numel: int,
    base: torch.Tensor,
    guard: MagnitudeGuard,
    out: torch.Tensor | None = None,
    hold: Any = None,
) -> Decoded | Rejection:
    """Decode a contribution whose header passed `check_contribution`, against the public
    value `base` of its base version: a payload that does not decode, a delta beyond the
    magnitude guard (core/guard.py) or one that overflows float32 is refused. `out`: a
    buffer to decode into; `hold`: the fused kernels, to keep the frame as it is until the
    round closes (`intake.decode_from`)."""
    try:  # one pass: decoded, measured, taken from the base and checked finite
        flat = base if base.dim() == 1 else base.view(-1)
        theta, norm, finite = intake.decode_from(c.payload, flat, out, hold, c.unpacked)
    except codec.CodecError as exc:
        return Rejection(Refusal.PAYLOAD, f"bad payload: {exc}")
    rate = guard.rate_of(c.fragment, norm, c.steps)
    bad = guard.check(c.fragment, rate, base)
    if bad is not None:
        return bad
    if not (finite if finite is not None else codec.all_finite(theta)):
        return Rejection(Refusal.MAGNITUDE, "base - delta overflows float32")
    return Decoded(theta, rate)
