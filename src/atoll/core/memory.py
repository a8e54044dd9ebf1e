"""The syncer's memory as a formula of the model and the settings (`memory_bytes`), for a
capacity plan and the benchmark that checks it (benchmarks/syncer_memory.py).

N values in P fragments of about N/P each, M contributions a round. Persistent (held between
rounds, once warm):
    theta, public                  2 * 4N      (the exact value and the learners' copy)
    outer state                    0 (sgd), 4N (nesterov), 8N (delayed nesterov, at most)
    history (History, core/history.py), each fragment, `history` = K versions kept:
        full values   4n * ((RECENT - 1) + ceil((K - RECENT - 1) / full_every) + 1)
        frames        F(n, down_codec) * (K - 1 - checkpoints)
      full_every = 0 (frames only): F(n, down_codec) * (K - 1), no full value (after a
      restore, the restored versions count in full until they age out);
      (down_codec fp32: every version in full, 4n * (K - 1)); with history_bytes > 0 at most
      that many bytes in all; plus one resolved version cached, 4n
    heal frames                    P * F(n, heal_codec)  (once a learner healed)
    open rounds                    open_rounds * M * 2 F(n, up_codec): each contribution
                                   held as its frame and its body decompressed (the fused
                                   round, fragments of 256K values and up: core/fused.py);
                                   else M * (4n + F(n, up_codec)), its decoded values (between
                                   rounds the M decode buffers are kept for the next one)
    round buffers                  held: up to POOL (6) * 4n that committed rounds let go of,
                                   kept for the next closes (fused.give)
Transient, on top, at their moments:
    closing a round                held: (4 + outer) * 4n (the merge, the new values, the
                                   broadcast); else (M + 8) * 4n (deltas, merge, new values,
                                   broadcast, the tape record)
    a snapshot                     (snapshot_history - shared) * 4n * P: the older versions
                                   it resolves from frames (it writes the protocol's own
                                   tensors, never copies, piece by piece); shared: the newest
                                   versions held in full, RECENT (frames only: 1)
with n = N / P and F(n, scheme) a frame's bytes (28 + the body: 4n fp32, 2n bf16,
n + 2 * groups int8, n/2 + 2 * groups int4, groups = ceil(n / group); plus at most
body/256 + 64 that zstd adds to a body it cannot shrink). Not counted: the
process itself (Python, torch, gRPC: `base_bytes`), updates queued for slow links (each
learner's queue for a fragment stays under 4n before it is sent in full instead).
"""

from __future__ import annotations

import math

from atoll.core.fused import MIN_VALUES as FUSED_MIN_VALUES
from atoll.core.fused import POOL
from atoll.core.history import RECENT

HEADER = 28  # a codec frame's header (core/codec.py)
OUTER_COPIES = {"sgd": 0, "nesterov": 1, "delayed_nesterov": 2}


def frame_bytes(n: int, scheme: str, group: int = 64, zstd: bool = True) -> int:
    """A frame of n values in `scheme`; `zstd` (as frames are sent): an upper bound, the
    body uncompressed plus what zstd adds to a body it cannot shrink."""
    g = max(1, min(group, n))  # one group of all the values when they are fewer
    groups = math.ceil(n / g)
    body = {
        "fp32": 4 * n,
        "bf16": 2 * n,
        "int8": groups * g + 2 * groups,
        "int4": math.ceil(groups * g / 2) + 2 * groups,
    }[scheme]
    return HEADER + body + (body // 256 + 64 if zstd else 0)


def history_bytes_per_fragment(
    n: int, keep: int, full_every: int, down_codec: str, group: int = 64
) -> int:
    """What one fragment's history holds beyond its public value, once `keep` versions are
    held (the cached resolved version not included)."""
    if down_codec == "fp32":
        return 4 * n * (keep - 1)
    if full_every == 0:  # frames only
        return frame_bytes(n, down_codec, group) * (keep - 1)
    middle = max(0, keep - RECENT - 1)
    checkpoints = math.ceil(middle / full_every)
    full = (min(RECENT, keep) - 1) + checkpoints + (1 if keep > RECENT else 0)
    frames = keep - 1 - checkpoints
    return 4 * n * full + frame_bytes(n, down_codec, group) * frames


def memory_bytes(
    N: int,
    P: int,
    M: int,
    *,
    history: int = 64,
    full_every: int = 16,
    history_bytes: int = 0,
    down_codec: str = "int4",
    up_codec: str = "int4",
    heal_codec: str = "int8",
    group: int = 64,
    outer: str = "sgd",
    open_rounds: int = 1,
    snapshot_history: int = 8,
    base_bytes: int = 0,
    fused: str = "auto",
) -> dict[str, int]:
    """The syncer's bytes by component (module docstring), `steady` (held between rounds,
    once warm), `round_peak` (steady + closing a round) and `snapshot_peak`. `fused`: the
    syncer's setting (its rounds hold contributions as their frames for fragments the kernels
    take, core/fused.py)."""
    n = math.ceil(N / P)
    held = fused == "on" or (fused == "auto" and n >= FUSED_MIN_VALUES)
    outer_copies = OUTER_COPIES.get(outer, 2)
    hist = P * history_bytes_per_fragment(n, history, full_every, down_codec, group)
    if history_bytes > 0:
        hist = min(hist, history_bytes)
    parts = {
        "theta_public": 8 * n * P,
        "outer": 4 * n * P * outer_copies,
        "history": hist,
        "history_cache": 4 * n,
        "heal_frames": P * frame_bytes(n, heal_codec, group),
        "open_rounds": open_rounds * M * pending_bytes(n, up_codec, group, held),
        "round_buffers": POOL * 4 * n if held else 0,
        "base": base_bytes,
    }
    steady = sum(parts.values())
    shared = RECENT if full_every else 1  # newest versions a snapshot shares, not copies
    snap = 4 * n * P * max(0, snapshot_history - shared)  # the older versions it resolves
    closing = (4 + outer_copies) * 4 * n if held else (M + 8) * 4 * n
    return {
        **parts,
        "steady": steady,
        "round_peak": steady + closing,
        "snapshot_peak": steady + snap,
    }


def pending_bytes(n: int, up_codec: str, group: int = 64, held: bool = True) -> int:
    """One contribution waiting for its round: its frame, and either the frame's body
    decompressed (held, core/fused.py) or its decoded values (4 bytes a value)."""
    frame = frame_bytes(n, up_codec, group)
    return 2 * frame if held else 4 * n + frame
