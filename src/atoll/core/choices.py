"""The allowed values of every enumerated setting, defined and checked in one place.

Each tuple is the one spelling of its values; the core module that acts on a value imports
its tuple from here (codec, fragments, fused, merge, outer, receipt). `check_choices` checks any
settings object (the config's `ProtocolSettings`, the core's `LearnerConfig` and
`SyncerConfig`) against them, field by field name. This module imports no torch: a bad setting
is answered before anything heavy is loaded.
"""

from __future__ import annotations

import os

from atoll.errors import ConfigError

CODECS = ("fp32", "bf16", "int8", "int4")  # in the order of their wire codes (codec.SCHEMES)
PACKINGS = ("balanced", "strided")  # how tensors are grouped into fragments (make_plan)
FUSED_MODES = ("auto", "on", "off")  # the syncer's fused data path (core/fused.py)
MERGES = ("rda", "mean")
LIGHT_ROUNDS = ("scale", "full")
WEIGHTINGS = ("tokens", "uniform")  # tokens^2/steps, or 1 per contribution
OUTER_OPTIMIZERS = ("nesterov", "delayed_nesterov", "sgd")
RECEIPT_MODES = ("overwrite", "blend", "carry")
SCHEDULES = ("pull", "push")  # "pull": the syncer paces rounds; "push": learners' step counts

CHOICES: dict[str, tuple[str, ...]] = {
    "packing": PACKINGS,
    "schedule": SCHEDULES,
    "merge": MERGES,
    "weighting": WEIGHTINGS,
    "light_rounds": LIGHT_ROUNDS,
    "outer": OUTER_OPTIMIZERS,
    "receipt": RECEIPT_MODES,
    "codec": CODECS,
    "down_codec": CODECS,
    "heal_codec": CODECS,
    "sync_codec": CODECS,
    "fused": FUSED_MODES,
}


def check_choice(key: str, value: object) -> None:
    """Raise ConfigError naming `key`, `value` and the allowed values unless it is one."""
    allowed = CHOICES[key]
    if value not in allowed:
        raise ConfigError(key, value, f"one of {', '.join(allowed)}")


def check_choices(settings: object, empty_ok: tuple[str, ...] = ()) -> None:
    """Check every enumerated setting `settings` has (by attribute name); a key in `empty_ok`
    may also be "" (e.g. the syncer's `codec`: '' = any)."""
    for key in CHOICES:
        if hasattr(settings, key):
            value = getattr(settings, key)
            if not (key in empty_ok and value == ""):
                check_choice(key, value)


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_fused(fused: str, threads: str) -> int:
    """The syncer round's data path (`fused`) and its thread count `threads` checked ("auto":
    every core the process may use); the thread count resolved (core/fused.py's `check`)."""
    check_choice("fused", fused)
    n = cores()
    if threads == "auto":
        return n
    try:
        k = int(threads)
    except ValueError:
        k = 0
    if not 1 <= k <= n:
        raise ConfigError(
            "syncer_threads", threads, f"auto or an integer in [1, {n}] (the cores it may use)"
        )
    return k
