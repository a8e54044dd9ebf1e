"""atoll runs on Python 3.10 (pyproject's requires-python): vermin, reading src/ and examples/,
finds nothing newer. What 3.11 added is reached through atoll/compat.py (marked `# novm`)."""

import sys
from pathlib import Path

import pytest
import vermin

ROOT = Path(__file__).resolve().parents[2]
FLOOR = (3, 10)


def min_python(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *paths: Path
) -> tuple[tuple[int, ...], str]:
    """The minimum Python 3 vermin reports for `paths`, and its report (the violations). One
    process (--processes=1): vermin's pool would start others."""
    args = ["--no-config-file", "--processes=1", "--target=3.10-", "--violations"]
    args += ["--eval-annotations", "--no-tips", "--format", "parsable", *map(str, paths)]
    monkeypatch.setattr(sys, "argv", ["vermin", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        vermin.main()
    report = capsys.readouterr().out
    py3 = report.strip().splitlines()[-1].split(":")[4]  # the last line, ":::py2:py3:": the least
    return tuple(int(x) for x in py3.split(".")), report


def test_src_and_examples_run_on_python_3_10(capsys, monkeypatch) -> None:
    found, report = min_python(capsys, monkeypatch, ROOT / "src", ROOT / "examples")
    assert found <= FLOOR, report


def test_an_unguarded_3_11_construct_is_caught(capsys, monkeypatch, tmp_path: Path) -> None:
    utc = "import datetime\nnow = datetime.datetime.now(datetime.UTC)\n"
    for source in ("import tomllib\n", utc, "from enum import StrEnum\n"):
        (tmp_path / "new.py").write_text(source)
        found, report = min_python(capsys, monkeypatch, tmp_path)
        assert found == (3, 11), report
