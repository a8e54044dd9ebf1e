"""Every setting in one place.

- settings.py  SimConfig: the run, model/data/training, protocol and simulated-world groups
               (each a frozen dataclass with its own `validate`), flat in one dataclass
- live.py      LiveConfig: the live-only settings (ports, heartbeats, chaos, comm mode)
- parse.py     the one `--set key=value` / JSON / TOML reader, and `to_args`

Every key, its default and what it does: the field comments in settings.py and live.py.
"""

from atoll.config.live import COMM_MODES, LiveConfig, check_comm
from atoll.config.parse import (
    add_set_argument,
    build,
    parse_overrides,
    split_overrides,
    to_args,
    with_overrides,
)
from atoll.config.settings import (
    METHODS,
    ModelSettings,
    ProtocolSettings,
    RunSettings,
    SimConfig,
    WorldSettings,
)

__all__ = [
    "COMM_MODES",
    "METHODS",
    "LiveConfig",
    "ModelSettings",
    "ProtocolSettings",
    "RunSettings",
    "SimConfig",
    "WorldSettings",
    "add_set_argument",
    "build",
    "check_comm",
    "parse_overrides",
    "split_overrides",
    "to_args",
    "with_overrides",
]
