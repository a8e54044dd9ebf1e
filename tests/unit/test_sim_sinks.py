"""`atoll sim --tensorboard DIR`: each run of the preset under DIR/RUN, read back with
tensorboard's own reader: a Decoupled run's figures from its event stream (the live view's
names, keyed by tokens) end at the run's results, and every run has its eval-loss curve."""

import json

import pytest

from atoll.cli import main as atoll_main
from tests.unit.test_sim import TINY


def test_sim_writes_each_runs_figures_for_tensorboard(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, tb = tmp_path / "sim", tmp_path / "tb"
    sets = [f"--set={k}={v}" for k, v in {**TINY, "steps": 16}.items()]
    # a learner killed at 2 s (virtual): a second incarnation of L1 in the stream
    rc = atoll_main(["sim", "--preset", "quick", *sets, "--set=scenario=kill:L1@2+1",
                     "--out", str(out), "--quiet", "--no-plot",
                     "--tensorboard", str(tb)])  # fmt: skip
    assert rc == 0
    results = {r["name"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert {p.name for p in tb.iterdir()} == set(results) == {"decoupled", "data_parallel"}

    def scalars(run: str) -> dict:
        acc = EventAccumulator(str(tb / run))
        acc.Reload()
        return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}

    d, r = scalars("decoupled"), results["decoupled"]
    assert r["failures"] == 1
    assert {f"learner/L{i}/tokens_per_s" for i in range(4)} <= set(d)
    tokens = d["run/tokens"]
    assert len(tokens) > 10 and all(s.step == int(s.value) for s in tokens)  # keyed by tokens
    assert [s.value for s in tokens] == sorted(s.value for s in tokens)
    # the stream's last figures are the run's results (bytes: every link's, both ways)
    assert tokens[-1].value == r["tokens"]
    assert d["run/rounds"][-1].value == r["rounds"]
    assert d["run/goodput"][-1].value == pytest.approx(r["goodput"], rel=1e-6)
    assert d["run/wire_mb"][-1].value == pytest.approx((r["bytes_up"] + r["bytes_down"]) / 1e6)
    assert d["run/data_parallel_mb"][-1].value == pytest.approx(r["dp_bytes"] / 1e6, rel=1e-3)
    for name, run in results.items():  # every run: its held-out loss at each eval point
        losses = [(s.step, s.value) for s in scalars(name)["run/eval_loss"]]
        assert losses == [(c["tokens"], pytest.approx(c["eval_loss"])) for c in run["curve"]]
    b = scalars("data_parallel")
    assert b["run/tokens"][-1].value == results["data_parallel"]["tokens"]
