"""The bandwidth formulas: hand-computed cases, inverse consistency, scaling laws, bad input."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atoll.bandwidth import cli
from atoll.bandwidth.model import (
    METHODS,
    BandwidthConfig,
    allreduce_factor,
    average_rate,
    measured_vs_predicted,
    required_bandwidth,
    utilization,
)
from atoll.errors import ConfigError

C = BandwidthConfig()


def test_data_parallel_by_hand() -> None:
    # ring over 8: 2*7/8 * 5e9 * 16 bits, hidden behind 2/3 s of backward + 1/19 s of slack
    expected = 1.75 * 5e9 * 16 / (2 / 3 + 0.05 / 0.95)
    assert required_bandwidth("dp", C) == pytest.approx(expected)


def test_decoupled_by_hand() -> None:
    # 2 fragments of 5e9/24 int4 values in flight, each given 2 s + 1/19 s
    expected = 2 * (5e9 / 24 * 4) / (2 + 0.05 / 0.95)
    assert required_bandwidth("decoupled", C) == pytest.approx(expected)


def test_allreduce_factors() -> None:
    assert allreduce_factor("ring", 2) == 1.0
    assert allreduce_factor("ring", 8) == 1.75
    assert allreduce_factor("star", 8) == 1.0
    assert allreduce_factor("naive", 8) == 7.0


def test_sync_every_h_steps_divides_the_average_rate_by_h() -> None:
    ratio = average_rate("dp", replace(C, bits_dp=C.bits)) / average_rate("diloco", C)
    assert ratio == pytest.approx(C.H)
    assert average_rate("streaming", C) == pytest.approx(average_rate("diloco", C))


def test_latency_beyond_the_slack_needs_infinite_bandwidth() -> None:
    assert required_bandwidth("dp", replace(C, latency_s=5.0)) == math.inf
    assert math.isfinite(required_bandwidth("decoupled", replace(C, latency_s=1.0)))


@settings(max_examples=60, deadline=None)
@given(
    method=st.sampled_from(METHODS),
    u=st.floats(0.5, 0.995),
    params=st.floats(1e7, 1e12),
    step=st.floats(0.05, 30),
    dcs=st.integers(2, 64),
    tau=st.integers(1, 4),
    pattern=st.sampled_from(["ring", "star", "naive"]),
)
def test_required_bandwidth_reaches_the_target_and_scales(
    method: str,
    u: float,
    params: float,
    step: float,
    dcs: int,
    tau: int,
    pattern: str,
) -> None:
    c = replace(
        C, utilization=u, params=params, step_s=step, datacenters=dcs, tau=tau, pattern=pattern
    )
    w = required_bandwidth(method, c)
    assert utilization(method, c, w) >= u - 1e-9
    assert w >= average_rate(method, c) * u * (1 - 1e-12)  # the link carries every sync
    # twice the model -> twice the bandwidth; twice the step time -> half
    assert required_bandwidth(method, replace(c, params=2 * params)) == pytest.approx(2 * w)
    assert required_bandwidth(method, replace(c, step_s=2 * step)) == pytest.approx(w / 2)
    assert required_bandwidth(method, replace(c, utilization=min(0.999, u + 0.004))) >= w


def test_measured_vs_predicted_on_synthetic_traffic() -> None:
    duration = 3600.0
    exact = average_rate("decoupled", C) * duration / 8
    assert measured_vs_predicted("decoupled", C, exact, duration) == pytest.approx(1.0)
    assert measured_vs_predicted("decoupled", C, 1.25 * exact, duration) == pytest.approx(1.25)
    assert measured_vs_predicted("dp", C, exact, duration) < 0.01
    with pytest.raises(ConfigError):
        measured_vs_predicted("decoupled", C, exact, 0.0)


@pytest.mark.parametrize(
    ("change", "setting"),
    [
        ({"params": 0}, "params"),
        ({"datacenters": 1}, "datacenters"),
        ({"utilization": 1.0}, "utilization"),
        ({"pattern": "mesh"}, "pattern"),
        ({"fragments": 48}, "fragments"),
        ({"tau": 0}, "tau"),
        ({"latency_s": -1}, "latency_s"),
        ({"message_bytes": -1.0}, "message_bytes"),
        ({"message_bytes": math.nan}, "message_bytes"),
        ({"message_bytes": math.inf}, "message_bytes"),
        ({"control_bps": -0.5}, "control_bps"),
        ({"control_bps": math.nan}, "control_bps"),
    ],
)
def test_bad_config_names_the_setting(change: dict, setting: str) -> None:
    with pytest.raises(ConfigError) as err:
        replace(C, **change)
    assert err.value.setting == setting
    assert "\n" not in str(err.value) and str(err.value).startswith(f"{setting}=")


@pytest.mark.parametrize(
    ("fragments", "H", "step_s"), [(24, 24, 1.0), (12, 24, 0.05), (4, 24, 2.0)]
)
def test_message_bytes_add_exactly_syncs_times_bytes(fragments: int, H: int, step_s: float):
    """Over a duration, message_bytes adds (syncs in it) x bytes and control_bps its bits/s,
    on top of the payload term, which they leave alone; the required bandwidth is untouched."""
    base = replace(C, fragments=fragments, H=H, step_s=step_s, framing=1.069)
    duration = 3600.0
    syncs = duration / (H / fragments * step_s)  # Decoupled: one fragment every H/P steps
    for method in METHODS:
        with_msg = replace(base, message_bytes=450.0)
        extra = (average_rate(method, with_msg) - average_rate(method, base)) * duration / 8
        per_sync = {"dp": 1, "diloco": H, "streaming": H / fragments, "decoupled": H / fragments}
        assert extra == pytest.approx(450.0 * duration / (per_sync[method] * step_s))
        with_ctl = replace(with_msg, control_bps=3000.0)
        added = average_rate(method, with_ctl) - average_rate(method, with_msg)
        assert added == pytest.approx(3000.0)
        assert required_bandwidth(method, with_ctl) == required_bandwidth(method, base)
    extra = average_rate("decoupled", replace(base, message_bytes=450.0)) - average_rate(
        "decoupled", base
    )
    assert extra * duration / 8 == pytest.approx(syncs * 450.0)
    # the measured/predicted ratio falls by exactly the overhead's share of the prediction
    exact = average_rate("decoupled", base) * duration / 8
    c = replace(base, message_bytes=450.0)
    assert measured_vs_predicted("decoupled", c, exact + syncs * 450.0, duration) == (
        pytest.approx(1.0)
    )


def test_cli_takes_the_overheads(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--message-bytes", "450", "--control-bps", "4000"])
    assert (args.message_bytes, args.control_bps) == (450.0, 4000.0)
    assert cli.main(args) == 0
    assert "450 B per sync, 4000 bit/s control" in capsys.readouterr().out


def test_unknown_method() -> None:
    with pytest.raises(ConfigError) as err:
        required_bandwidth("allgather", C)
    assert err.value.setting == "method"


def test_cli_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    out = tmp_path / "bw.json"
    assert cli.main(parser.parse_args(["--sensitivity", "--json", str(out)])) == 0
    doc = json.loads(out.read_text())
    assert set(doc["methods"]) == set(METHODS)
    assert (
        doc["methods"]["dp"]["required_gbps"] > 100 * doc["methods"]["decoupled"]["required_gbps"]
    )
    assert "decoupled" in capsys.readouterr().out


def test_codec_bits_are_the_frames_actual_size():
    """`--codec`: bits per value from the codec's own frames, not a nominal figure."""
    assert 24.0 < cli.codec_bits("fp32", n=1 << 16) < 32.1  # zstd takes a little of it
    int4 = cli.codec_bits("int4", n=1 << 16)
    assert 3.0 < int4 < 4.25  # zstd takes the Gaussian codes below the nominal 4.25
    with pytest.raises(ConfigError, match="--codec='int3'"):
        cli.codec_bits("int3")
