"""Every setting in one place.

- job.py       JobConfig: the nested settings of a job (sections run, model, protocol, world,
               live), validated once; `job.sim` is the flat view drivers use
- settings.py  the run, model/data/training, protocol and simulated-world sections (each a
               frozen dataclass with its own `validate`), and SimConfig: the four flat in one
- live.py      LiveConfig: the live section (ports, heartbeats, chaos, comm mode)
- parse.py     the one `--set [section.]key=value` / JSON / TOML reader, and `to_args`
- options.py   the live processes' options built from a JobConfig (SyncerOptions, the
               learner's keyword arguments)

Every key, its default and what it does: the field comments in settings.py and live.py.
"""

from atoll.config.job import SECTIONS, JobConfig, resolve_key
from atoll.config.live import COMM_MODES, LiveConfig, check_comm
from atoll.config.parse import (
    add_set_argument,
    build,
    load_job,
    parse_overrides,
    split_overrides,
    to_args,
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
    "SECTIONS",
    "JobConfig",
    "LiveConfig",
    "ModelSettings",
    "ProtocolSettings",
    "RunSettings",
    "SimConfig",
    "WorldSettings",
    "add_set_argument",
    "build",
    "check_comm",
    "load_job",
    "parse_overrides",
    "resolve_key",
    "split_overrides",
    "to_args",
]
