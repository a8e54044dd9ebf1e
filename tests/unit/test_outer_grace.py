import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from atoll.core.grace import GracePolicy
from atoll.core.outer import OuterOptimizer, OuterState
from atoll.errors import ConfigError


def test_nesterov_matches_hand_written_reference():
    lr, mu = 0.7, 0.9
    theta, buf = [1.0, -2.0], [0.0, 0.0]
    opt, state = OuterOptimizer("nesterov", lr, mu), OuterState()
    t = torch.tensor(theta)
    for delta in ([0.1, 0.2], [-0.3, 0.05], [0.0, 1.0]):
        buf = [mu * b + d for b, d in zip(buf, delta)]
        theta = [x - lr * (d + mu * b) for x, d, b in zip(theta, delta, buf)]
        t = opt.step(t, torch.tensor(delta), state)
        assert torch.allclose(t, torch.tensor(theta), atol=1e-6)


def test_delayed_nesterov_with_delay_one_is_nesterov():
    a, b = OuterOptimizer("nesterov"), OuterOptimizer("delayed_nesterov", delay=1)
    sa, sb = OuterState(), OuterState()
    ta = tb = torch.zeros(3)
    for i in range(5):
        d = torch.tensor([0.1 * i, -0.2, 0.3])
        ta, tb = a.step(ta, d, sa), b.step(tb, d, sb)
    assert torch.allclose(ta, tb)


def test_delayed_nesterov_refreshes_momentum_every_n():
    opt, st_ = OuterOptimizer("delayed_nesterov", lr=1.0, momentum=0.5, delay=2), OuterState()
    t = opt.step(torch.zeros(1), torch.ones(1), st_)
    assert float(t) == -1.0 and float(st_.buf) == 0.0  # plain step, momentum untouched
    t = opt.step(t, torch.ones(1), st_)
    # buf = 0.5*0 + mean(1, 1) = 1; step = 1 + 2*0.5*1
    assert float(st_.buf) == 1.0 and float(t) == -3.0


@pytest.mark.parametrize(
    "kw,key",
    [({"kind": "adam"}, "outer"), ({"lr": 0}, "outer_lr"), ({"momentum": 1.0}, "outer_momentum")],
)
def test_outer_bad_settings(kw, key):
    with pytest.raises(ConfigError) as err:
        OuterOptimizer(**kw)
    assert err.value.setting == key


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 8),
    st.floats(0, 0.99),
    st.lists(
        st.tuples(st.floats(1e-3, 100), st.floats(0, 100), st.floats(0, 100)),
        min_size=1,
        max_size=20,
    ),
)
def test_grace_window_never_exceeds_slack_or_a_step(tau, gamma, obs):
    g = GracePolicy(quorum=1, tau=tau, gamma=gamma)
    for step, quorum, sync in obs:
        g.step.update(step)
        g.to_quorum.update(quorum)
        g.sync.update(sync)
        w = g.window()
        assert 0 <= w <= max(g.slack(), 0.0) + 1e-12
        assert w <= g.step.value + 1e-12


def test_grace_window_zero_when_disabled_or_unmeasured():
    g = GracePolicy(quorum=1, tau=2)
    assert g.window() == 0.0
    g.step.update(1.0)
    assert g.window() == pytest.approx(0.5 * 2.0)  # gamma * tau * step, clamped to a step -> 1
    assert GracePolicy(quorum=1, tau=2, enabled=False).window() == 0.0
