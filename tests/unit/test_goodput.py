"""Sanity laws and contracts of the goodput simulator (small clusters, short horizons)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats

from atoll.errors import ConfigError
from atoll.goodput import Cluster, Constants, RecoveryDelay, expected_goodput, parse_system
from atoll.goodput.simulate import simulate

DAY = 86400.0
YEAR = 365 * DAY
C = Constants(
    restart_s=60.0,
    checkpoint_cost_s=1.0,
    downscale_s=20.0,
    upscale_s=10.0,
    rejoin_wait_s=60.0,
    speed_sigma=0.0,
    slice_chips=375,
)


def run(
    name: str,
    chips: int,
    days: float = 20.0,
    seed: int = 0,
    c: Constants = C,
    mtbi_s: float = YEAR,
    quorum: int = 1,
):
    return simulate(parse_system(name, quorum), Cluster(chips, mtbi_s), c, days * DAY, seed)


@pytest.mark.parametrize("name", ["dp", "dp_elastic", "decoupled_m4"])
def test_no_failures_means_full_goodput(name: str) -> None:
    r = run(name, 150_000, mtbi_s=1e30)
    assert r.goodput == pytest.approx(1.0, abs=1e-6)
    assert r.uptime == pytest.approx(1.0, abs=1e-6)
    assert r.interruptions == 0


def test_failures_cost_goodput() -> None:
    assert run("dp", 150_000).goodput < 0.9
    assert run("dp_elastic", 150_000).goodput < 0.97


@pytest.mark.parametrize("name", ["dp", "dp_elastic"])
def test_cluster_interruption_rate_scales_as_chips(name: str) -> None:
    for chips in (37_500, 150_000, 600_000):
        r = run(name, chips, days=10)
        rate = r.interruptions / r.exposed_s
        assert rate == pytest.approx(chips / YEAR, rel=0.05), chips


@pytest.mark.parametrize("learners", [2, 4, 8])
def test_m_learners_behave_like_one_elastic_job_on_n_over_m(learners: int) -> None:
    chips = 150_000
    decoupled = run(f"decoupled_m{learners}", chips * learners, days=10).goodput
    elastic = run("dp_elastic", chips, days=10, seed=1).goodput
    assert decoupled == pytest.approx(elastic, abs=0.01)


def test_ordering_matches_the_paper() -> None:
    g = [
        run(n, 600_000, days=5).goodput
        for n in ("dp", "dp_elastic", "decoupled_m2", "decoupled_m4", "decoupled_m16")
    ]
    assert g == sorted(g)


@pytest.mark.parametrize("name", ["dp", "dp_elastic", "decoupled_m8"])
@pytest.mark.parametrize("chips", [75_000, 1_200_000])
def test_simulation_agrees_with_closed_form(name: str, chips: int) -> None:
    c = replace(C, speed_sigma=0.002)
    sim = run(name, chips, days=20, c=c).goodput
    assert sim == pytest.approx(expected_goodput(parse_system(name), Cluster(chips), c), abs=0.01)


def test_quorum_costs_goodput_and_agrees_with_closed_form() -> None:
    chips, c = 600_000, replace(C, downscale_s=200.0, upscale_s=200.0)
    k1 = run("decoupled_m4", chips, days=10, c=c).goodput
    k4 = run("decoupled_m4", chips, days=10, c=c, quorum=4)
    assert k4.goodput < k1 - 0.05
    assert k4.goodput == pytest.approx(
        expected_goodput(parse_system("decoupled_m4", 4), Cluster(chips), c), abs=0.02
    )


def test_deterministic_given_seed() -> None:
    a, b, other = (
        run("decoupled_m4", 300_000, seed=3),
        run("decoupled_m4", 300_000, seed=3),
        run("decoupled_m4", 300_000, seed=4),
    )
    assert a.goodput == b.goodput and np.array_equal(a.timeline_goodput, b.timeline_goodput)
    assert a.goodput != other.goodput


def test_timeline_averages_to_goodput() -> None:
    r = run("dp_elastic", 300_000, days=3)
    assert np.mean(r.timeline_goodput) == pytest.approx(r.goodput, rel=1e-9)
    assert r.timeline_s[0] == 0.0 and r.timeline_s[-1] == pytest.approx(3 * DAY)


def test_speed_spread_slows_lockstep_groups() -> None:
    c = replace(C, speed_sigma=0.01)
    slow = run("dp_elastic", 150_000, days=5, c=c).goodput
    assert slow < run("dp_elastic", 150_000, days=5).goodput - 0.03


def test_recovery_delay_matches_exponentiated_weibull() -> None:
    d = RecoveryDelay(a=2.0, c=0.8, scale_s=30.0)
    x = d.sample(np.random.default_rng(0), 20_000)
    ks = stats.kstest(x, stats.exponweib(d.a, d.c, scale=d.scale_s).cdf)
    assert ks.pvalue > 0.01


@pytest.mark.parametrize(
    ("name", "chips", "mtbi", "quorum", "setting"),
    [
        ("dp", 0, YEAR, 1, "chips"),
        ("dp", -375, YEAR, 1, "chips"),
        ("dp", 150_000, 0.0, 1, "mtbi"),
        ("dp", 150_000, -1.0, 1, "mtbi"),
        ("decoupled_m7", 150_000, YEAR, 1, "learners"),
        ("dp", 150_001, YEAR, 1, "chips"),
        ("decoupled_m4", 150_000, YEAR, 5, "quorum"),
        ("sgd", 150_000, YEAR, 1, "system"),
        ("decoupled_m0", 150_000, YEAR, 1, "system"),
    ],
)
def test_bad_input_names_the_setting(
    name: str, chips: int, mtbi: float, quorum: int, setting: str
) -> None:
    with pytest.raises(ConfigError) as err:
        simulate(parse_system(name, quorum), Cluster(chips, mtbi), C, DAY)
    assert err.value.setting == setting
    assert str(err.value.value) in str(err.value) and err.value.allowed in str(err.value)


@settings(max_examples=40, deadline=None)
@given(
    restart=st.floats(0, 600),
    down=st.floats(0, 300),
    up=st.floats(0, 300),
    wait=st.floats(0, 600),
    sigma=st.floats(0, 0.01),
    slices=st.sampled_from([32, 64, 400, 6400]),
    learners=st.sampled_from([1, 2, 4, 16]),
)
def test_closed_form_is_a_fraction_and_falls_with_failure_rate(
    restart: float,
    down: float,
    up: float,
    wait: float,
    sigma: float,
    slices: int,
    learners: int,
) -> None:
    # With a free down-scale but a costly up-scale, more failures can save up-scales (a
    # recovered slice rides along with the next down-scale): the law needs down >= up.
    assume(down >= up)
    c = replace(
        C, restart_s=restart, downscale_s=down, upscale_s=up, rejoin_wait_s=wait, speed_sigma=sigma
    )
    name = "dp" if learners == 1 else f"decoupled_m{learners}"
    rare = expected_goodput(parse_system(name), Cluster(slices * 375, YEAR), c)
    often = expected_goodput(parse_system(name), Cluster(slices * 375, YEAR / 4), c)
    assert 0.0 <= often <= rare + 1e-12 <= 1.0 + 1e-12


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    slices=st.sampled_from([32, 160, 1600]),
    name=st.sampled_from(["dp", "dp_elastic", "decoupled_m2", "decoupled_m16"]),
    mtbi_days=st.floats(0.5, 3650),
)
def test_simulated_goodput_and_uptime_are_fractions(
    seed: int, slices: int, name: str, mtbi_days: float
) -> None:
    r = run(name, slices * 375, days=1.0, seed=seed, mtbi_s=mtbi_days * DAY)
    assert 0.0 <= r.goodput <= r.uptime + 1e-12 <= 1.0 + 1e-9
    assert np.all((r.timeline_goodput >= -1e-12) & (r.timeline_goodput <= 1.0 + 1e-9))
