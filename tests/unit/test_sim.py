"""End-to-end runs of the virtual-time driver on a tiny model."""

import dataclasses
import json

import pytest

from atoll.cli import SUBCOMMANDS
from atoll.cli import main as atoll_main
from atoll.config import SimConfig
from atoll.sim.baselines import run_data_parallel, run_sync_diloco
from atoll.sim.decoupled import DecoupledSim
from atoll.sim.presets import PRESETS
from atoll.sim.runner import run_preset

TINY = dict(
    n_layer=1,
    d_model=32,
    n_head=2,
    context=32,
    batch=8,
    steps=48,
    P=8,
    H=8,
    eval_batches=2,
    eval_points=3,
    data_bytes=400_000,
    warmup=5,
)


def tiny(**kw) -> SimConfig:
    return SimConfig(**{**TINY, **kw})


def test_one_learner_with_carry_and_plain_outer_step_is_exactly_local_training():
    # M=1, fp32, outer SGD with lr 1, carry: every merge hands the learner back its own
    # value, so the global model must end where ordinary training ends.
    kw = dict(
        learners=1,
        outer="sgd",
        outer_lr=1.0,
        codec="fp32",
        down_codec="fp32",
        receipt="carry",
        light_rounds="full",  # "scale" would move Theta less for a light final flush
    )
    dec = DecoupledSim(tiny(**kw)).run()
    ref = run_data_parallel(tiny(**kw, method="data_parallel"))
    assert dec.eval_loss == pytest.approx(ref.eval_loss, abs=1e-5)
    assert dec.tokens == ref.tokens


def test_decoupled_run_learns_and_sends_far_fewer_bytes_than_data_parallel():
    r = DecoupledSim(tiny(learners=3)).run()
    assert r.curve[-1]["eval_loss"] < r.curve[0]["eval_loss"] - 0.2
    assert r.goodput > 0.95 and r.blocked_s == 0.0
    assert r.bytes_up * 50 < r.dp_bytes
    assert r.rounds > 0 and 1 <= r.participants_mean <= 3


def test_baselines_learn():
    for fn in (run_data_parallel, run_sync_diloco):
        r = fn(tiny(learners=2))
        assert r.curve[-1]["eval_loss"] < r.curve[0]["eval_loss"]
        assert 0 < r.goodput <= 1


def test_wait_for_all_with_mixed_speeds_blocks_fast_learners():
    base = dict(learners=2, speeds="1,1.5", schedule="push")
    sim = DecoupledSim(tiny(**base, quorum=2, grace=False))
    k2 = sim.run()
    k1 = DecoupledSim(tiny(**base, quorum=1, grace=False)).run()
    assert k2.blocked_s > 0 and k2.goodput < 0.95
    # the event stream accounts for every second of waiting the result reports
    waits = sum(e.data["wait_s"] for e in sim.events if e.kind == "blocked")
    assert waits == pytest.approx(k2.blocked_s)
    assert k1.blocked_s == 0 and k1.goodput > k2.goodput
    assert k2.participants_mean > k1.participants_mean


def test_pull_schedule_gathers_mixed_speed_learners_into_the_same_rounds():
    base = dict(learners=2, speeds="1,1.5", schedule="pull")
    k1 = DecoupledSim(tiny(**base, quorum=1, grace=False)).run()
    grace = DecoupledSim(tiny(**base, quorum=1, grace=True)).run()
    push = DecoupledSim(tiny(**{**base, "schedule": "push"}, quorum=1, grace=True)).run()
    assert grace.participants_mean > 1.7 > k1.participants_mean
    assert grace.participants_mean > push.participants_mean
    assert grace.blocked_s == 0 and grace.goodput > 0.95


def test_failed_learners_lose_unsent_work_heal_and_rejoin():
    r = DecoupledSim(tiny(learners=3, steps=60, mtbf_s=20.0, downtime_s=5.0)).run()
    assert r.failures >= 1
    assert r.down_s > 0 and r.lost_work_s > 0
    assert r.goodput < 1.0
    assert r.curve[-1]["eval_loss"] < r.curve[0]["eval_loss"]
    dp = run_data_parallel(tiny(learners=3, steps=60, mtbf_s=20.0, downtime_s=5.0))
    assert dp.failures >= 1 and dp.goodput < r.goodput


def test_same_seed_gives_identical_json_and_another_seed_does_not():
    preset = PRESETS["quick"]
    a = json.dumps(run_preset(preset, {**TINY, "steps": 16}), sort_keys=True)
    b = json.dumps(run_preset(preset, {**TINY, "steps": 16}), sort_keys=True)
    c = json.dumps(run_preset(preset, {**TINY, "steps": 16, "seed": 1}), sort_keys=True)
    assert a == b
    assert a != c


def test_cli_writes_json_and_plot(tmp_path, capsys):
    sets = [f"--set={k}={v}" for k, v in {**TINY, "steps": 16}.items()]
    rc = atoll_main(
        [
            "sim",
            "--preset",
            "quick",
            *sets,
            "--json",
            str(tmp_path / "r.json"),
            "--out",
            str(tmp_path / "out"),
            "--quiet",
        ]
    )
    assert rc == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["preset"] == "quick" and data["seed"] == 0
    for run in data["runs"]:
        assert run["method"] in ("data_parallel", "sync_diloco", "decoupled")
        for key in (
            "eval_loss",
            "tokens",
            "wall_time_s",
            "goodput",
            "bytes_up",
            "bytes_down",
            "dp_bytes",
        ):
            assert key in run
        assert 0 <= run["goodput"] <= 1
    assert (tmp_path / "out" / "loss.png").stat().st_size > 1000
    lines = (tmp_path / "out" / "events-decoupled.jsonl").read_text().splitlines()
    kinds = {json.loads(line)["kind"] for line in lines}
    assert {"sent", "round_closed", "applied", "healed"} <= kinds


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--preset", "nope"], "preset='nope'"),
        (["--set", "quorum=9"], "quorum=9"),
        (["--set", "tau=24"], "tau=24"),
        (["--set", "bandwidth_mbps=-1"], "bandwidth_mbps=-1.0"),
        (["--set", "P=29", "--set", "H=30"], "P=29"),
        (["--set", "colour=blue"], "colour='blue'"),
        (["--set", "learners=two"], "learners='two'"),
        (["--set", "speeds=1,2,3"], "speeds='1,2,3'"),
    ],
)
def test_bad_settings_stop_with_a_message_naming_them(args, needle, capsys, tmp_path):
    rc = atoll_main(["sim", *args, "--quiet", "--no-plot", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err and "not allowed" in err


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_subcommand_prints_its_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        atoll_main([command, "--help"])
    assert done.value.code == 0
    assert f"usage: atoll {command}" in capsys.readouterr().out


def test_a_contribution_that_does_not_encode_makes_its_learner_heal_and_the_run_goes_on():
    """The virtual-time driver hands an encode failure (a diverged learner's values) to the
    learner protocol (`on_unsendable`), as the live communication side does (NotSent): the
    contribution is not sent, the learner heals, the run ends as usual."""
    from atoll.core import codec
    from atoll.core.events import Healed, PushRefused
    from atoll.sim.decoupled import DecoupledSim
    from tests.helpers import CFG

    sim = DecoupledSim(dataclasses.replace(CFG, steps=12))
    learner = sim.learners[0]
    encode, calls = learner.encoder.encode, [0]

    def broken_once(o):
        calls[0] += 1
        if calls[0] == 2:
            raise codec.CodecError("payload holds non-finite values")
        return encode(o)

    learner.encoder.encode = broken_once
    res = sim.run()
    mine = [e for e in sim.events if e.source == learner.id]
    (refused,) = [e.data for e in mine if isinstance(e.data, PushRefused)]
    assert refused.reason == "not sent: payload holds non-finite values"
    assert sum(isinstance(e.data, Healed) for e in mine) == 2  # its join, then the heal asked
    assert res.tokens >= CFG.learners * 12 * CFG.batch * CFG.context
