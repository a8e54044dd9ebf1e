"""The allowed values of every enumerated setting, checked in one place.

Each tuple is the one spelling of its values (the core modules that act on a value define
it); `check_choices` checks any settings object (the config's `ProtocolSettings`, the core's
`LearnerConfig` and `SyncerConfig`) against them, field by field name.
"""

from __future__ import annotations

from atoll.core.codec import SCHEMES
from atoll.core.fragments import PACKINGS
from atoll.core.fused import FUSED_MODES
from atoll.core.merge import LIGHT_ROUNDS, MERGES, WEIGHTINGS
from atoll.core.outer import OUTER_OPTIMIZERS
from atoll.core.receipt import RECEIPT_MODES
from atoll.errors import ConfigError

SCHEDULES = ("pull", "push")  # "pull": the syncer paces rounds; "push": learners' step counts
CODECS = tuple(SCHEMES)

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
