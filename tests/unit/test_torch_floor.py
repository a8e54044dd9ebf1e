"""`import atoll` on a torch older than 2.5 stops with one line: the version found, the one
needed and the command that installs it (atoll/torch_floor.py). tests/e2e/test_torch_floor.py
runs `python -c "import atoll"` against a fake old torch."""

import importlib.util
import sys
import types
from pathlib import Path

import pytest

import atoll
from atoll import torch_floor


@pytest.mark.parametrize(
    "version", ["2.5.0", "2.5.1+cu124", "2.13.0+cpu", "2.5.0a0+git123", "2.6.0.dev20241001", "3.0"]
)
def test_a_recent_torch_passes(version: str) -> None:
    torch_floor.check(version)


@pytest.mark.parametrize("version", ["2.4.1", "2.3.0", "2.4.0a0+gitabc", "1.13.1+cu117"])
def test_an_older_torch_is_refused_in_one_line(version: str) -> None:
    with pytest.raises(ImportError) as info:
        torch_floor.check(version)
    assert isinstance(info.value, torch_floor.TorchVersionError)
    expected = f"atoll needs torch >= 2.5 (found {version}): pip install 'torch>=2.5'"
    assert str(info.value) == expected


def _fake_torch(root: Path, init: str, version_py: str | None = None) -> Path:
    (root / "torch").mkdir()
    (root / "torch" / "__init__.py").write_text(init)
    if version_py is not None:
        (root / "torch" / "version.py").write_text(version_py)
    return root


def test_the_version_is_read_from_torch_version_py_without_importing_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version_py = "from typing import Optional\n\n__version__ = '2.3.1+cu121'\ndebug = False\n"
    _fake_torch(tmp_path, 'raise RuntimeError("imported")\n', version_py)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert torch_floor.installed_version() == "2.3.1+cu121"
    assert "torch" not in sys.modules


def test_a_torch_without_version_py_is_asked(tmp_path: Path, monkeypatch) -> None:
    _fake_torch(tmp_path, '__version__ = "2.4.0"\n')
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert torch_floor.installed_version() == "2.4.0"


def test_the_real_torch_passes() -> None:
    import torch

    torch_floor.check(torch.__version__)


def test_atoll_init_stops_on_an_old_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    # atoll/__init__.py run afresh (as another module) under a torch that says 2.4.0
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__="2.4.0"))
    spec = importlib.util.spec_from_file_location("atoll_again", atoll.__file__)
    assert spec is not None and spec.loader is not None
    with pytest.raises(torch_floor.TorchVersionError, match=r"^atoll needs torch >= 2\.5 \(found"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
