"""Calibration honesty and the table/CLI contracts."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from atoll.errors import ConfigError
from atoll.goodput import Cluster, Constants, calibrate, cli, expected_goodput, parse_system


def test_fit_recovers_constants_that_generated_the_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    truth = Constants(
        restart_s=45.0,
        checkpoint_cost_s=2.0,
        downscale_s=12.0,
        upscale_s=25.0,
        rejoin_wait_s=120.0,
        speed_sigma=0.0,
    )
    fake = {
        s: tuple(
            expected_goodput(parse_system(s), Cluster(n), truth) for n in calibrate.TABLE_CHIPS
        )
        for s in calibrate.FIT_ON
    }
    monkeypatch.setattr(calibrate, "PAPER", {**calibrate.PAPER, **fake})
    got = calibrate.fit(Constants(speed_sigma=0.0), fixed=frozenset({"speed_sigma"}))
    for name in ("restart_s", "checkpoint_cost_s", "downscale_s", "upscale_s", "rejoin_wait_s"):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=0.05), name


def test_fit_never_sees_the_decoupled_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    before = calibrate.fit()
    scrambled = {
        k: (v if k in calibrate.FIT_ON else (0.1,) * 5) for k, v in calibrate.PAPER.items()
    }
    monkeypatch.setattr(calibrate, "PAPER", scrambled)
    assert calibrate.fit() == before


def test_fixed_constants_are_not_fitted() -> None:
    got = calibrate.fit(replace(Constants(), upscale_s=3.0), fixed=frozenset({"upscale_s"}))
    assert got.upscale_s == 3.0


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_table_json_has_the_promised_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "table.json"
    assert cli.main(_args("--table", "--days", "1", "--json", str(out))) == 0
    doc = json.loads(out.read_text())
    assert len(doc["cells"]) == 30
    systems = {"dp", "dp_elastic", "decoupled_m2", "decoupled_m4", "decoupled_m8", "decoupled_m16"}
    for cell in doc["cells"]:
        assert set(cell) == {"system", "chips", "goodput", "paper"}
        assert cell["system"] in systems and isinstance(cell["chips"], int)
        assert 0.0 <= cell["goodput"] <= 1.0 and 0.0 <= cell["paper"] <= 1.0
    assert doc["fitted"]["fitted_on"] == ["dp", "dp_elastic"]
    assert "restart_s" in doc["fitted"]
    assert "decoupled_m16" in capsys.readouterr().out


def test_single_run_prints_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "t.png"
    code = cli.main(
        _args(
            "--chips",
            "30000",
            "--days",
            "1",
            "--systems",
            "dp,decoupled_m4",
            "--quorum",
            "2",
            "--plot",
            str(png),
            "--restart-s",
            "30",
        )
    )
    assert code == 0 and png.stat().st_size > 1000
    assert "decoupled_m4" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "setting"),
    [
        (("--chips", "0"), "chips"),
        (("--mtbi-days", "-1"), "mtbi_days"),
        (("--systems", "dp,ring"), "system"),
        (("--chips", "150000", "--systems", "decoupled_m7"), "learners"),
        (("--recovery", "1,2"), "recovery"),
    ],
)
def test_cli_bad_input(argv: tuple[str, ...], setting: str) -> None:
    with pytest.raises(ConfigError) as err:
        cli.main(
            _args(
                *argv,
                "--days",
                "0.1",
                "--restart-s",
                "1",
                "--checkpoint-cost-s",
                "1",
                "--downscale-s",
                "1",
                "--upscale-s",
                "1",
                "--rejoin-wait-s",
                "1",
                "--speed-sigma",
                "0",
            )
        )
    assert err.value.setting == setting
