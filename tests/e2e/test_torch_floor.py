"""`python -c "import atoll"` under a torch older than 2.5 (a fake one first on PYTHONPATH)
exits non-zero, its last line the one-line message (atoll/torch_floor.py); under the real torch
it passes without importing torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[2] / "src"


def _python(code: str, path: list[Path]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in [*path, SRC])}
    cmd = [sys.executable, "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_import_atoll_stops_on_an_old_torch_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('__version__ = "2.4.0"\n')
    out = _python("import atoll", [tmp_path])
    assert out.returncode != 0
    message = "atoll needs torch >= 2.5 (found 2.4.0): pip install 'torch>=2.5'"
    last = out.stderr.strip().splitlines()[-1]
    assert last == f"atoll.torch_floor.TorchVersionError: {message}", out.stderr


def test_import_atoll_under_the_real_torch_does_not_import_it() -> None:
    out = _python("import sys, atoll; print('torch' in sys.modules)", [])
    assert out.returncode == 0 and out.stdout.split() == ["False"], out.stderr
