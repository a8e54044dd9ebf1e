"""The oldest torch atoll runs on, checked at `import atoll` (src/atoll/__init__.py).

2.5 made DTensor public as `torch.distributed.tensor` (torch.distributed._tensor before), which
the learner imports. An older torch would fail later, deep in a learner, with an import error
that does not say why; `import atoll` says it in one line instead. The check reads the version
without importing torch (a torch import takes seconds, and `import atoll` alone does not pay it).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

NEEDED = (2, 5)

# release numbers at the front: "2.13.0+cpu", "2.5.0a0+git123", "2.6.0.dev20241001" (a pre-release
# or nightly of 2.5 has 2.5's API: NVIDIA's containers ship such builds)
_RELEASE = re.compile(r"\s*(\d+)\.(\d+)")
# torch/version.py, written by torch's build: `__version__ = '2.13.0+cpu'`
_VERSION_PY = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", re.MULTILINE)


class TorchVersionError(ImportError):
    """The installed torch is older than atoll needs; the message says which and what to do."""


def message(found: str) -> str:
    need = ".".join(map(str, NEEDED))
    return f"atoll needs torch >= {need} (found {found}): pip install 'torch>={need}'"


def check(version: str) -> None:
    """Raise `TorchVersionError` when torch `version` (its `__version__`) is below `NEEDED`.
    A version this cannot read passes: torch itself then decides."""
    m = _RELEASE.match(version)
    if m is not None and (int(m.group(1)), int(m.group(2))) < NEEDED:
        raise TorchVersionError(message(version), name="torch")


def installed_version() -> str | None:
    """The version of the torch `import torch` would give, or None without one."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return getattr(torch, "__version__", None)
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or ():
        try:
            text = (Path(folder) / "version.py").read_text()
        except OSError:
            continue
        found = _VERSION_PY.search(text)
        if found is not None:
            return found.group(1)
    import torch  # a torch without the usual version.py: ask it

    return getattr(torch, "__version__", None)


def check_installed() -> None:
    """`check` the installed torch, if any (a missing one fails where it is imported)."""
    version = installed_version()
    if version is not None:
        check(version)
