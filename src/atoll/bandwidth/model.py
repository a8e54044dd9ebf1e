"""WAN bandwidth each method needs to reach a target compute utilisation. Every formula is here.

Notation: N parameters, s seconds per inner step, b bits per value, D datacenters (one learner
or replica per datacenter), P fragments, H inner steps between syncs of a fragment, tau steps
of compute a fragment's transfer may overlap, u the target compute utilisation, L latency.
Bandwidth W is per datacenter link, per direction (links are full duplex), in bits/s.

Bits one datacenter sends per sync (the receive direction carries the same amount):
  all-reduce among D replicas:  X = a(D) * values * b, with a(D) from the pattern:
      ring   a = 2 (D - 1) / D   (reduce-scatter then all-gather; the bandwidth-optimal one)
      star   a = 1               (to a hub and back; the hub's own link carries D - 1 times it)
      naive  a = D - 1           (everyone sends everything to everyone)
  Decoupled DiLoCo: a learner sends its fragment to the syncer and receives the merged one:
      X = values * b, whatever the pattern (a sharded syncer spreads the hub load).

Per method: values synced, steps between syncs g, and the compute a transfer can hide behind:
  dp          values N,     g = 1,     window = f * s  (overlap with the backward pass)
  diloco      values N,     g = H,     window = f * s  (only the last step's backward pass)
  streaming   values N / P, g = H / P, window = tau * s, k = max(1, tau * P / H) in flight
  decoupled   values N / P, g = H / P, window = tau * s, k = max(1, tau * P / H) in flight
  (k transfers in flight share the link, so each takes k * X / W.)
Stall per sync = max(0, k * X / W + L - window); utilisation = g s / (g s + stall).
Solving utilisation >= u for W:   W = k * X / (window + g * s * (1 - u) / u - L),
and never below the throughput bound W >= X * u / (g * s) (the link must carry every sync).
If the denominator is <= 0 no bandwidth is enough (the latency alone breaks the target).
Average rate actually carried (what a live run measures): X / (g * s), times `framing` for
the bytes on the wire: every 1448-byte TCP segment travels in a 1514-byte Ethernet frame, and
the other direction's data is acknowledged by a 66-byte frame every two segments, so a
gRPC stream of large messages costs 1514/1448 + 66/2896 = 1.069 times its payload on the
interface (`WIRE_FRAMING`; measured with the peer benchmark, BENCHMARKS.md). framing = 1 (the
default) gives the payload alone, the unit of the paper's figures.

Fixed costs on the wire (live runs): every sync also costs bytes that do not grow with its
payload, and a live runtime sends some bytes whatever it syncs. Average rate on the wire:
    framing * X / (g * s)  +  8 * message_bytes / (g * s)  +  control_bps
  message_bytes  bytes per sync on a link, per direction, beyond framing * payload. In atoll's
                 Decoupled exchange (one fragment up, its merged update down): the PushOne call
                 and its reply (HTTP/2 HEADERS with the run id, token and protocol metadata, the
                 ContributionHeader, trailers), the pull sent down the Pulls stream, the
                 broadcast's UpdateHeader, TLS records, and the Ethernet/IP/TCP headers of the
                 part-filled segments and ACKs these take (about 3 frames of 66 bytes each way).
                 A round split in two (a late answer) adds a broadcast the model does not count.
  control_bps    bits/s per link per direction whatever is synced: atoll's heartbeat calls (one
                 every heartbeat_s, 0.5 s by default) and their replies.
None of these is derived from first principles: benchmarks/wire_overhead.py measures them on
links shaped with tc, with TLS and the secret, P = H = 24, 50 ms steps, fragment payloads of
0.8, 1.6 and 5.1 kB a step (and one run with heartbeats 5x as often), three repeats, and fits
wire = framing * payload + message_bytes * exchanges + beat_bytes * heartbeats per direction
(benchmarks/results/multihost/wire_overhead.json, BENCHMARKS.md section 7): up 463 B and 4.0
kbit/s, down 431 B and 2.8 kbit/s, with framing 1.099 up and 1.092 down (the fitted framing is
above WIRE_FRAMING's 1.069; with 1.069 held fixed the fit gives 554 / 501 B and fits the runs
less well). Both default to 0: the paper's figures are payload only. They enter
`average_rate` only, what a link carries on average; the required bandwidth stays the
payload's (framing is not in it either). For an all-reduce a sync is several messages: give
their total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from atoll.errors import ConfigError

METHODS = ("dp", "diloco", "streaming", "decoupled")
WIRE_FRAMING = 1514 / 1448 + 66 / (2 * 1448)  # interface bytes per payload byte (docstring)
PATTERNS = ("ring", "star", "naive")


@dataclass(frozen=True)
class BandwidthConfig:
    """The inputs. Defaults: a 5B model at 1 s/step across 8 datacenters, the paper's
    P = H = 24, tau = 2, int4 outer gradients, bf16 data-parallel gradients, 95% utilisation."""

    params: float = 5e9
    step_s: float = 1.0
    datacenters: int = 8
    bits_dp: float = 16.0
    bits: float = 4.0
    fragments: int = 24
    H: int = 24
    tau: int = 2
    utilization: float = 0.95
    backward_fraction: float = 2.0 / 3.0
    pattern: str = "ring"
    latency_s: float = 0.0
    framing: float = 1.0  # bytes on the wire per payload byte (WIRE_FRAMING: a veth counter)
    message_bytes: float = 0.0  # wire bytes per sync per link and direction beyond its payload
    control_bps: float = 0.0  # bits/s per link and direction whatever is synced (heartbeats)

    def __post_init__(self) -> None:
        positive = ("params", "step_s", "bits_dp", "bits")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(name, getattr(self, name), "a positive number")
        for name in ("datacenters", "fragments", "H", "tau"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(name, value, "a positive integer")
        if self.datacenters < 2:
            raise ConfigError("datacenters", self.datacenters, "at least 2")
        if not 0 < self.utilization < 1:
            raise ConfigError("utilization", self.utilization, "a fraction in (0, 1)")
        if not 0 <= self.backward_fraction <= 1:
            raise ConfigError("backward_fraction", self.backward_fraction, "a fraction [0, 1]")
        if self.pattern not in PATTERNS:
            raise ConfigError("pattern", self.pattern, ", ".join(PATTERNS))
        if not 1 <= self.framing < math.inf:
            raise ConfigError("framing", self.framing, "a number >= 1 (1: payload alone)")
        if not 0 <= self.message_bytes < math.inf:
            raise ConfigError("message_bytes", self.message_bytes, "a number of bytes >= 0")
        if not 0 <= self.control_bps < math.inf:
            raise ConfigError("control_bps", self.control_bps, "a number of bits/s >= 0")
        if self.latency_s < 0:
            raise ConfigError("latency_s", self.latency_s, "a non-negative number of seconds")
        if self.fragments > self.H:
            raise ConfigError("fragments", self.fragments, f"at most H={self.H}")


def allreduce_factor(pattern: str, datacenters: int) -> float:
    """a(D): bits each datacenter sends per value per all-reduce, in units of b."""
    d = datacenters
    return {"ring": 2.0 * (d - 1) / d, "star": 1.0, "naive": float(d - 1)}[pattern]


def ring_allreduce_bytes(nbytes: int, workers: int) -> int:
    """Bytes each worker sends in a ring all-reduce of an `nbytes` buffer."""
    return 0 if workers <= 1 else int(allreduce_factor("ring", workers) * nbytes)


@dataclass(frozen=True)
class SyncShape:
    """One method's sync: bits sent per link per sync, steps between syncs, hiding window
    (seconds) and transfers in flight at once."""

    bits: float
    steps: float
    window_s: float
    in_flight: float


def sync_shape(method: str, c: BandwidthConfig) -> SyncShape:
    """The per-sync traffic and timing of `method` (see the module docstring)."""
    a = allreduce_factor(c.pattern, c.datacenters)
    per_fragment = c.params / c.fragments
    in_flight = max(1.0, c.tau * c.fragments / c.H)
    backward = c.backward_fraction * c.step_s
    if method == "dp":
        return SyncShape(a * c.params * c.bits_dp, 1.0, backward, 1.0)
    if method == "diloco":
        return SyncShape(a * c.params * c.bits, float(c.H), backward, 1.0)
    if method == "streaming":
        return SyncShape(a * per_fragment * c.bits, c.H / c.fragments, c.tau * c.step_s, in_flight)
    if method == "decoupled":
        return SyncShape(per_fragment * c.bits, c.H / c.fragments, c.tau * c.step_s, in_flight)
    raise ConfigError("method", method, ", ".join(METHODS))


def required_bandwidth(method: str, c: BandwidthConfig) -> float:
    """Bits/s per datacenter link (per direction) for `method` to reach c.utilization.

    math.inf when no bandwidth is enough (latency larger than the slack).
    """
    shape = sync_shape(method, c)
    slack = shape.steps * c.step_s * (1.0 - c.utilization) / c.utilization
    room = shape.window_s + slack - c.latency_s
    if room <= 0:
        return math.inf
    throughput = shape.bits * c.utilization / (shape.steps * c.step_s)
    return max(shape.in_flight * shape.bits / room, throughput)


def utilization(method: str, c: BandwidthConfig, bandwidth_bps: float) -> float:
    """Compute utilisation of `method` on links of `bandwidth_bps` (the inverse check)."""
    if not bandwidth_bps > 0:
        raise ConfigError("bandwidth_bps", bandwidth_bps, "a positive number")
    shape = sync_shape(method, c)
    stall = max(0.0, shape.in_flight * shape.bits / bandwidth_bps + c.latency_s - shape.window_s)
    compute = shape.steps * c.step_s
    return compute / (compute + stall)


def average_rate(method: str, c: BandwidthConfig) -> float:
    """Bits/s per link per direction a run of `method` actually carries on average (on the
    wire when `c.framing` > 1, with every sync's fixed `c.message_bytes` and `c.control_bps`)."""
    shape = sync_shape(method, c)
    period = shape.steps * c.step_s
    return (c.framing * shape.bits + 8.0 * c.message_bytes) / period + c.control_bps


def measured_vs_predicted(
    method: str, c: BandwidthConfig, measured_bytes: float, duration_s: float
) -> float:
    """Ratio of bytes measured on one link (one direction) over `duration_s` to the model's
    prediction for that duration. 1.0 means the model is exact; > 1 the run sent more."""
    if not measured_bytes >= 0:
        raise ConfigError("measured_bytes", measured_bytes, "a non-negative number")
    if not duration_s > 0:
        raise ConfigError("duration_s", duration_s, "a positive number of seconds")
    return 8.0 * measured_bytes / (average_rate(method, c) * duration_s)
