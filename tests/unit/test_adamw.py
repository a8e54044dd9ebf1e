"""The built-in model's AdamW (model/adamw.py) is torch.optim.AdamW bit for bit (that it
imports no torch._dynamo: tests/integration/test_learner_imports.py)."""

import pytest
import torch

from atoll.model.adamw import AdamW


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.GELU(), torch.nn.Linear(5, 3))


def _train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for s in range(steps):
        for group in opt.param_groups:
            group["lr"] = 1e-2 * (1 + s) / steps  # the schedule sets lr before each step
        x = torch.randn(9, 7, generator=g)
        model(x).square().mean().backward()
        if s == 2:  # a parameter without a gradient this step is left as it is
            model[2].bias.grad = None
        opt.step()
        opt.zero_grad(set_to_none=s % 2 == 0)


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_it_is_torchs_adamw_bit_for_bit(wd):
    a, b = _model(0), _model(0)
    kw = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": wd}
    ours, theirs = AdamW(a.parameters(), **kw), torch.optim.AdamW(b.parameters(), **kw)
    _train(a, ours, 6, 1)
    _train(b, theirs, 6, 1)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    st_a, st_b = ours.state_dict()["state"], theirs.state_dict()["state"]
    for i in st_b:
        assert st_a[i]["step"] == float(st_b[i]["step"])
        assert torch.equal(st_a[i]["exp_avg_sq"], st_b[i]["exp_avg_sq"])


def test_its_state_restores_to_the_same_next_step():
    a, b = _model(3), _model(3)
    oa = AdamW(a.parameters(), lr=1e-2, weight_decay=0.1)
    _train(a, oa, 4, 5)
    b.load_state_dict(a.state_dict())
    ob = AdamW(b.parameters(), lr=1.0)
    ob.load_state_dict(oa.state_dict())
    assert ob.param_groups[0]["lr"] == oa.param_groups[0]["lr"]
    _train(a, oa, 3, 6)
    _train(b, ob, 3, 6)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    with pytest.raises(ValueError, match="state of 4 parameters; this optimizer has 1"):
        AdamW([torch.nn.Parameter(torch.zeros(2))]).load_state_dict(oa.state_dict())


def test_bad_settings_name_the_value():
    with pytest.raises(ValueError, match="lr=-1 is not allowed"):
        AdamW(_model(0).parameters(), lr=-1)
    with pytest.raises(ValueError, match=r"betas=\(0.9, 1.0\) is not allowed"):
        AdamW(_model(0).parameters(), betas=(0.9, 1.0))
