"""`atoll plan`: the capacity formulas by hand, the command's table and JSON, and bad input."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from atoll.bandwidth.model import average_rate, utilization
from atoll.cli import main
from atoll.errors import ConfigError
from atoll.plan import model
from atoll.plan.cli import parse_size
from atoll.plan.model import PlanConfig, plan, speedup, syncer_bytes_per_param


def test_measured_rates_are_the_benchmarks_figures() -> None:
    """The rates are those of benchmarks/syncer_service.py's committed result (its line
    through two model sizes, snapshots apart), to the digits written in atoll.plan.model."""
    path = Path(__file__).parents[2] / "benchmarks/results/syncer_service/service.json"
    doc = json.loads(path.read_text())
    assert model.NS_PER_VALUE == pytest.approx(doc["fit"]["ns_per_value"], abs=0.05)
    fixed = doc["fit"]["fixed_ms_per_contribution"] * 1e-3
    assert model.PER_CONTRIBUTION_S == pytest.approx(fixed, abs=0.05e-3)
    big = max(doc["rows"], key=lambda r: r["params"])
    assert model.SNAPSHOT_NS_PER_BYTE == pytest.approx(big["snapshot_ns_per_byte"], abs=0.005)
    # the line gives back each size's measured CPU per contribution (two points: exactly)
    for r in doc["rows"]:
        per = model.PER_CONTRIBUTION_S + model.NS_PER_VALUE * 1e-9 * r["fragment_values"]
        assert per == pytest.approx(r["cpu_ms_per_contribution_without_snapshots"] / 1e3, rel=0.02)
    assert {r["clients"] for r in [doc]} == {8} and min(r["params"] for r in doc["rows"]) > 25e6


def test_the_tape_writes_a_records_bytes_per_merge() -> None:
    c = PlanConfig(params=12e9, step_s=1.0, H=24)
    assert plan(c)["tape_bytes_per_s"] == pytest.approx(8 * 12e9 / 24)
    assert plan(replace(c, outer="nesterov"))["tape_bytes_per_s"] == pytest.approx(12 * 12e9 / 24)


def test_memory_per_parameter_is_the_syncers_own_formula() -> None:
    from atoll.core.memory import memory_bytes

    n = 24 * (1 << 24)
    peak = memory_bytes(n, 24, 8)["snapshot_peak"] / n
    assert syncer_bytes_per_param(8) == pytest.approx(peak)
    # more learners or a longer history hold more; the history as frames, not 64 fp32 copies
    assert syncer_bytes_per_param(16) > syncer_bytes_per_param(8) > syncer_bytes_per_param(2)
    assert syncer_bytes_per_param(8, history=8) < syncer_bytes_per_param(8) < 8 + 4 * 64
    assert syncer_bytes_per_param(8, snapshot=False) < syncer_bytes_per_param(8)
    steady = memory_bytes(n, 24, 8, full_every=0, history=4, heal_codec="int4")["steady"] / n
    assert syncer_bytes_per_param(
        8, history=4, peak="steady", full_every=0, heal_codec="int4"
    ) == pytest.approx(steady)


def test_plan_with_a_frames_only_history() -> None:
    """--history-full-every 0 --history 4 --heal-codec int4 (BENCHMARKS.md section 11): at most
    12 bytes per parameter between snapshots; the snapshot peak reported apart."""
    c = PlanConfig(params=1e9, history=4, history_full_every=0, heal_codec="int4")
    p = plan(c)
    assert 11 < p["steady_bytes_per_param"] <= 12 < p["bytes_per_param"]
    d = plan(PlanConfig(params=1e9))
    assert d["steady_bytes_per_param"] > 60  # a snapshot resolves 6 older versions in full
    assert d["bytes_per_param"] == pytest.approx(d["steady_bytes_per_param"] + 4 * (8 - 2))
    small = plan(replace(c, snapshot_history=2))["bytes_per_param"]
    assert small == pytest.approx(p["steady_bytes_per_param"] + 4 * (2 - 1), rel=1e-3)
    for bad in ({"history_full_every": -1}, {"snapshot_history": 1}, {"heal_codec": "int3"}):
        with pytest.raises(ConfigError):
            replace(c, **bad)


def test_plan_by_hand() -> None:
    c = PlanConfig(params=100e6, step_s=1.0, learners=8)
    p = plan(c)
    per = model.PER_CONTRIBUTION_S + model.NS_PER_VALUE * 1e-9 * 100e6 / 24
    assert p["contributions_per_s"] == pytest.approx(8.0)  # M * P / (H * s)
    assert p["cpu_cores_load"] == pytest.approx(8 * per)
    assert p["shards"] == math.ceil(8 * per / 0.5) == p["shards_needed"]
    assert p["cores"] == 2 * p["shards"] and p["feasible"]
    assert p["ram_bytes"] == pytest.approx(
        p["shards"] * model.PROCESS_BYTES + 100e6 * syncer_bytes_per_param(8)
    )
    up = average_rate("decoupled", c.bandwidth(**model.WIRE_UP))
    assert p["syncer_in_gbps"] == pytest.approx(8 * up / 1e9)
    assert p["load_per_shard"] <= 0.5


def test_cpu_scales_with_learners_and_inverse_step_time() -> None:
    base = plan(PlanConfig(params=1e9, learners=4))["cpu_cores_load"]
    assert plan(PlanConfig(params=1e9, learners=8))["cpu_cores_load"] == pytest.approx(2 * base)
    assert plan(PlanConfig(params=1e9, learners=4, step_s=2))["cpu_cores_load"] == pytest.approx(
        base / 2
    )


def test_more_shards_than_fragments_is_not_feasible() -> None:
    p = plan(PlanConfig(params=12e9, learners=8))
    assert p["shards_needed"] > 24 and not p["feasible"]
    fast = plan(PlanConfig(params=12e9, learners=8, ns_per_value=1.0, step_s=10.0))
    assert fast["feasible"] and fast["shards"] <= 24


def test_given_shards_too_few_are_flagged() -> None:
    p = plan(PlanConfig(params=1e9, learners=8, step_s=1.0, shards=1))
    assert p["shards"] == 1 and p["shards_needed"] > 1 and not p["feasible"]


def test_speedup_is_the_ratio_of_utilisations() -> None:
    c = PlanConfig(params=12e9, learners=4, link_gbps=2.0)
    s = speedup(c)
    b = c.bandwidth()
    assert s["over_dp"] == pytest.approx(
        utilization("decoupled", b, 2e9) / utilization("dp", b, 2e9)
    )
    # 12B bf16 ring among 4: 1.5 * 12e9 * 16 bits = 288 Gbit a step on 2 Gbps: 144 s against
    # a 2/3 s window; Decoupled's 2 in flight of 12e9 / 24 * 4 bits (4 Gbit) hide in 2 s.
    assert s["utilization"]["dp"] == pytest.approx(1 / (1 + 144 - 2 / 3))
    assert s["utilization"]["decoupled"] == 1.0
    assert s["over_dp"] > 20 and s["over_diloco"] > 1
    assert speedup(replace(c, link_gbps=5.0))["over_dp"] < s["over_dp"]


@pytest.mark.parametrize(
    "text,value", [("100M", 1e8), ("1B", 1e9), ("12b", 12e9), ("1.5e9", 1.5e9), ("2T", 2e12)]
)
def test_sizes(text: str, value: float) -> None:
    assert parse_size(text) == value


def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--params", "100M,1B", "--paper"]) == 0
    out = capsys.readouterr().out
    assert "100M" in out and "1B" in out and "paper's setting" in out and ">20x" in out
    assert "2 Gbps" in out and "5 Gbps" in out


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--params", "1B", "--learners", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (p,) = doc["plans"]
    assert p["config"]["params"] == 1e9 and p["config"]["learners"] == 4
    assert p == plan(PlanConfig(params=1e9, learners=4))
    out = tmp_path / "plan.json"
    assert main(["plan", "--params", "12B", "--paper", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [s["link_gbps"] for s in doc["paper"]] == [2.0, 5.0]


@pytest.mark.parametrize(
    "argv,setting",
    [
        (["--params", "0"], "params"),
        (["--params=-5B"], "params"),
        (["--params", "lots"], "params"),
        (["--step-s", "0"], "step_s"),
        (["--step-s", "-1"], "step_s"),
        (["--fragments", "30", "--H", "24"], "fragments"),
        (["--shards", "0"], "shards"),
        (["--shards", "25"], "shards"),
        (["--link-gbps", "0"], "link_gbps"),
        (["--learners", "1"], "learners"),
        (["--max-core-load", "0"], "max_core_load"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], setting: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"atoll plan: error: {setting}=")
    assert "not allowed" in lines[0] and captured.out == ""


def test_bad_config_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="params"):
        PlanConfig(params=0)
    with pytest.raises(ConfigError, match="link_gbps"):
        speedup(PlanConfig(), link_gbps=0)


def test_codec_sets_the_bits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--codec", "int8", "--json"]) == 0
    bits = json.loads(capsys.readouterr().out)["plans"][0]["config"]["bits"]
    assert 6 < bits < 9  # int8 frames with scales, zstd on Gaussian values
    assert main(["plan", "--codec", "int9"]) == 2
    assert capsys.readouterr().err.strip().startswith("atoll plan: error: --codec='int9'")
