"""Chaos scenarios (atoll.chaos): the format, its checks, the timeline, the compact spec of
the live `chaos` setting, and each fault kind in the virtual-time driver on a tiny model."""

import dataclasses
import json
import math

import pytest

from atoll.chaos import KINDS, Fault, RandomCount, RandomFaults, Scenario, load
from atoll.config import SimConfig
from atoll.errors import ConfigError
from atoll.model.recipe import load_corpus
from atoll.sim.baselines import run_data_parallel
from atoll.sim.decoupled import DecoupledSim

SMALL = dict(
    n_layer=1,
    d_model=16,
    n_head=2,
    context=16,
    batch=4,
    steps=20,
    P=4,
    H=4,
    eval_batches=1,
    eval_points=1,
    data_bytes=100_000,
    warmup=2,
    learners=3,
)

TOML = """
horizon_s = 100.0
[[fault]]
kind = "kill"
target = "L1"
at = 20
duration = 3
[[fault]]
kind = "slow"
target = "L0"
at = 5.5
duration = 10
factor = 4
[[fault]]
kind = "kill_syncer"
at = 40
duration = 2
[[random]]
kind = "stall"
rate_per_min = 2.0
duration = 1.5
start = 10
[[random]]
kind = "kill"
count = 2
duration = 3
"""


# -- the format ---------------------------------------------------------------------------
def test_toml_parses_and_round_trips(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(TOML)
    sc = Scenario.from_toml(path).validate(4)
    assert sc.faults[0] == Fault(20.0, "kill", "L1", 3.0)
    assert sc.faults[1].factor == 4.0 and sc.faults[2].target == "syncer"
    assert sc.random == (RandomFaults("stall", 2.0, 1.5, 10.0), RandomCount("kill", 2, 3.0))
    assert sc.horizon_s == 100.0
    assert Scenario.from_dict(sc.to_dict()) == sc
    assert Scenario.from_dict(json.loads(json.dumps(sc.to_dict()))) == sc
    assert load(str(path), 9.0) == sc  # the `scenario` setting: a file ...
    assert load("kill:L1@20", 9.0).faults == (Fault(20.0, "kill", "L1", 9.0),)  # ... or a spec


@pytest.mark.parametrize("name", ["smoke", "soak"])
def test_example_scenarios_are_valid_for_four_learners(name):
    sc = Scenario.from_toml(f"scenarios/{name}.toml").validate(4)
    kinds = {f.kind for f in sc.timeline(4, 900.0, 0)}
    assert {"kill", "stall", "cut", "kill_syncer"} <= kinds


def _fault(**kw):
    return {"fault": [{"kind": "kill", "target": "L0", "at": 1.0, "duration": 1.0, **kw}]}


def _random(**kw):
    return {"random": [{"kind": "kill", "rate_per_min": 1.0, "duration": 1.0, **kw}]}


@pytest.mark.parametrize(
    "data, needle",
    [
        (_fault(kind="explode"), "fault[0].kind='explode' is not allowed: one of kill, stall"),
        (_fault(target="L4"), "fault[0].target='L4' is not allowed: a learner id L0..L3"),
        (_fault(target="worker"), "fault[0].target='worker'"),
        (_fault(target="L01"), "fault[0].target='L01'"),
        (_fault(at=-1.0), "fault[0].at=-1.0 is not allowed: seconds >= 0"),
        (_fault(at=math.inf), "fault[0].at=inf"),
        (_fault(duration=-2.0), "fault[0].duration=-2.0"),
        (_fault(kind="stall", target="syncer"), "stalling the syncer is not supported"),
        (_fault(kind="cut", target="syncer"), "kill the syncer with kind kill_syncer"),
        (_fault(kind="kill_syncer", target="L1"), "'syncer' for kill_syncer"),
        (_fault(kind="stall", duration=0.0), "fault[0].duration=0.0 is not allowed: seconds > 0"),
        (_fault(kind="add", duration=3.0), "fault[0].duration=3.0 is not allowed: 0"),
        (_fault(kind="slow", factor=0.5), "fault[0].factor=0.5 is not allowed: a number >= 1"),
        (_fault(factor=2.0), "a factor is for slow faults only"),
        (_fault(at="soon"), "fault[0].at='soon' is not allowed: a number"),
        (_fault(colour="red"), "fault[0].colour='red' is not allowed: a known key"),
        ({"fault": [{"kind": "kill", "at": 1.0}]}, "fault[0].target=None"),
        ({"faults": []}, "faults=[] is not allowed: a known key: fault, random, horizon_s"),
        (
            {"fault": [{"kind": "add", "target": "L1", "at": 9.0}, _fault()["fault"][0]]},
            None,
        ),
        (
            {"fault": [{"kind": "add", "target": "L0", "at": 9.0}, _fault()["fault"][0]]},
            "fault[1].at=1.0 is not allowed: a time >= 9.0 (L0 is added then)",
        ),
        (
            {"fault": [{"kind": "remove", "target": "L0", "at": 0.5}, _fault()["fault"][0]]},
            "(L0 is removed then)",
        ),
        (
            {"fault": [{"kind": "add", "target": "L0", "at": 1.0}] * 2},
            "fault[1].target='L0' is not allowed: a learner not already added",
        ),
        (
            {"fault": [{"kind": "add", "target": f"L{i}", "at": 1.0} for i in range(4)]},
            "at least one learner there from the start",
        ),
        (_random(kind="add"), "random[0].kind='add' is not allowed: one of kill, stall, cut"),
        (_random(rate_per_min=0.0), "random[0].rate_per_min=0.0 is not allowed: faults per"),
        (_random(start=10.0, end=5.0), "random[0].end=5.0 is not allowed: 0 (the horizon)"),
        ({"random": [{"kind": "kill", "count": -1, "duration": 1.0}]}, "random[0].count=-1"),
        ({"random": [{"kind": "kill", "count": 1.5, "duration": 1.0}]}, "an integer"),
        ({"horizon_s": -5}, "horizon_s=-5"),
    ],
)
def test_bad_scenarios_name_the_value_and_what_is_allowed(data, needle):
    if needle is None:  # the valid one of the group
        Scenario.from_dict(data).validate(4)
        return
    with pytest.raises(ConfigError) as exc:
        Scenario.from_dict(data).validate(4)
    assert needle in str(exc.value)


def test_errors_of_a_file_name_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[[fault]]\nkind = "kill"\ntarget = "L7"\nat = 1\n')
    with pytest.raises(ConfigError, match=r"bad.toml: fault\[0\].target='L7'"):
        Scenario.from_toml(path).validate(4)
    path.write_text("[[fault]\n")
    with pytest.raises(ConfigError, match="valid TOML"):
        Scenario.from_toml(path)
    with pytest.raises(ConfigError, match="an existing scenario file"):
        Scenario.from_toml(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="scenario="):
        SimConfig(scenario=str(tmp_path / "missing.toml")).validate()


# -- the timeline -------------------------------------------------------------------------
def test_timeline_is_sorted_deterministic_in_the_seed_and_grows_by_its_horizon():
    sc = Scenario(
        (Fault(50.0, "cut", "L1", 5.0), Fault(1.0, "kill_syncer", "syncer", 2.0)),
        (
            RandomFaults("kill", 3.0, 2.0),
            RandomFaults("kill_syncer", 0.5, 1.0, start=100.0, end=400.0),
            RandomCount("stall", 3, 1.0),
        ),
    ).validate(5)
    a, b = sc.timeline(5, 600.0, 7), sc.timeline(5, 600.0, 7)
    assert a == b and a != sc.timeline(5, 600.0, 8)
    assert [f.at for f in a] == sorted(f.at for f in a)
    assert all(f.target in {f"L{i}" for i in range(5)} for f in a if f.kind != "kill_syncer")
    kills = [f for f in a if f.kind == "kill"]
    assert 15 < len(kills) < 50  # ~3 a minute over 10 minutes
    assert {f.target for f in kills} == {f"L{i}" for i in range(5)}
    syncer = [f for f in a if f.kind == "kill_syncer" and f.at != 1.0]
    assert all(100 <= f.at < 400 and f.target == "syncer" for f in syncer)
    stalls = [f for f in a if f.kind == "stall"]
    assert len(stalls) == 3 and all(60 <= f.at <= 420 for f in stalls)  # [0.1, 0.7] x 600
    # a rate's faults over a longer horizon begin with those over the shorter one
    longer = [f for f in sc.timeline(5, 1200.0, 7) if f.kind == "kill"]
    assert longer[: len(kills)] == kills and len(longer) > len(kills)
    # a horizon fixed in the scenario wins over the driver's
    fixed = Scenario(random=(RandomFaults("kill", 3.0, 2.0),), horizon_s=60.0)
    assert max(f.at for f in fixed.timeline(5, 6000.0, 7)) < 60.0


# -- the compact spec of the live `chaos` setting ---------------------------------------
def _same(spec, learners, seed, horizon, delay):
    return [
        (f.at, f.kind, f.target, f.duration)
        for f in Scenario.from_spec(spec, delay)
        .validate(learners)
        .timeline(learners, horizon, seed)
    ]


# what atoll.live.launcher.parse_chaos(spec, learners, seed, horizon, delay) returned before
# it was replaced by this module, as (at, action, target, duration); stop -> stall, and a kill
# of the syncer -> kill_syncer
LEGACY = [
    (
        ("kill:L1@20+3,stop:L2@30+2,kill:syncer@40+2", 4, 0, 900.0, 3.0),
        [(20.0, "kill", "L1", 3.0), (30.0, "stop", "L2", 2.0), (40.0, "kill", "syncer", 2.0)],
    ),
    (
        ("random:3", 4, 0, 900.0, 3.0),
        [
            (152.59795457868782, "kill", "L3", 3.0),
            (269.9941409220396, "kill", "L1", 3.0),
            (554.4044079456908, "kill", "L0", 3.0),
        ],
    ),
    (
        ("random:4", 3, 7, 120.0, 1.5),
        [
            (39.30144539565835, "kill", "L0", 1.5),
            (73.82236037718727, "kill", "L1", 1.5),
            (77.07235316774816, "kill", "L2", 1.5),
            (78.20417215443511, "kill", "L1", 1.5),
        ],
    ),
    (
        (" kill:L0@5 , random:2, stop:L1@1 ", 2, 1, 60.0, 2.0),
        [
            (1.0, "stop", "L1", 2.0),
            (5.0, "kill", "L0", 2.0),
            (14.900074508150562, "kill", "L1", 2.0),
            (38.48836733780414, "kill", "L1", 2.0),
        ],
    ),
    (("", 4, 0, 900.0, 3.0), []),
]


@pytest.mark.parametrize("args, expected", LEGACY)
def test_from_spec_gives_what_the_launcher_parser_gave(args, expected):
    def kind(action, target):
        return {"stop": "stall"}.get(action, "kill_syncer" if target == "syncer" else action)

    assert _same(*args) == [(at, kind(a, t), t, d) for at, a, t, d in expected]


@pytest.mark.parametrize(
    "spec", ["bogus", "kill:L1", "kill:L1@soon", "random:x", "stop:syncer@1+2", "explode:L1@3"]
)
def test_bad_specs_name_the_chaos_setting(spec):
    with pytest.raises(ConfigError, match=r"^chaos="):
        Scenario.from_spec(spec, 3.0)


def test_specs_reach_every_kind_and_are_checked_against_the_learners():
    sc = Scenario.from_spec("slow:L1@10+20x4,add:L3@30,remove:L2@50,cut:L0@5,stall:L1@2+1", 3.0)
    assert {f.kind for f in sc.faults} | {"kill", "kill_syncer"} == set(KINDS)
    assert sc.faults[0] == Fault(10.0, "slow", "L1", 20.0, 4.0)
    assert sc.faults[1] == Fault(30.0, "add", "L3", 0.0) and sc.faults[3].duration == 3.0
    with pytest.raises(ConfigError, match=r"chaos: fault\[1\].target='L3'"):
        sc.validate(3)


# -- the virtual-time driver ----------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus():
    return load_corpus(SimConfig(**SMALL))


def run(corpus, scenario, **kw):
    sim = DecoupledSim(SimConfig(**{**SMALL, **kw, "scenario": scenario}), corpus=corpus)
    return sim, sim.run()


def of(sim, kind, source=None, lo=-1.0, hi=math.inf):
    return [
        e
        for e in sim.events
        if e.kind == kind and (source is None or e.source == source) and lo <= e.t < hi
    ]


def accepted_from(sim, lid, lo=-1.0, hi=math.inf):
    return [e for e in of(sim, "accepted", lo=lo, hi=hi) if e.data.learner == lid]


def test_kill_stall_and_remove_in_virtual_time(corpus):
    sim, r = run(corpus, "kill:L0@6+4,stop:L1@8+5,remove:L2@12")
    assert [(e.data.action, e.data.process) for e in of(sim, "chaos")] == [
        ("kill", "L0"),
        ("stall", "L1"),
        ("remove", "L2"),
    ]
    # the killed learner loses its unsent work, is down 4 s, heals and contributes again
    assert [e.t for e in of(sim, "failed", "L0")] == [6.0] and r.failures == 1
    assert of(sim, "failed", "L0")[0].data.lost_steps_s > 0
    assert len(of(sim, "healed", "L0")) == 2 and of(sim, "rejoined", "L0")[0].t >= 10.0
    assert not accepted_from(sim, "L0", 6.0, 10.0) and accepted_from(sim, "L0", 10.0)
    # the stalled one takes no step and sends nothing for 5 s, keeps its state (no heal)
    assert not of(sim, "sent", "L1", 8.0, 13.0) and not accepted_from(sim, "L1", 8.0, 13.0)
    assert of(sim, "sent", "L1", 13.0) and len(of(sim, "healed", "L1")) == 1
    assert not of(sim, "failed", "L1")
    # the removed one sends nothing more, and nothing of it is merged from then on
    assert not of(sim, "sent", "L2", 12.0) and not accepted_from(sim, "L2", 12.0)
    assert [e.data.why for e in of(sim, "lost") if e.data.learner == "L2"] == ["removed"]
    assert not of(sim, "failed", "L2")
    assert r.tokens >= SimConfig(**SMALL).budget_tokens()  # the others finish the budget


def test_added_learner_cut_and_slowed_links(corpus):
    sim, r = run(corpus, "add:L2@8,cut:L1@6+5,slow:L0@3+10x50", bandwidth_mbps=0.5)
    # the late learner: nothing before it is added, then it heals and contributes
    assert not of(sim, "sent", "L2", hi=8.0) and of(sim, "joined", "syncer", 8.0, 8.0 + 1e-9)
    assert accepted_from(sim, "L2", 8.0)
    # the cut link: the learner trains and sends, nothing arrives until it is back
    assert of(sim, "sent", "L1", 6.0, 11.0) and not accepted_from(sim, "L1", 6.0, 11.0)
    late = accepted_from(sim, "L1", 11.0)[0]
    assert late.t == pytest.approx(11.0, abs=0.2)
    # the slowed link: its contributions take longer to arrive than before and after
    sent = {e.data.seq: e.t for e in of(sim, "sent", "L0")}
    delay = {e.data.seq: e.t - sent[e.data.seq] for e in accepted_from(sim, "L0")}
    slow = [d for s, d in delay.items() if 3.0 <= sent[s] < 12.0]
    fast = [d for s, d in delay.items() if sent[s] >= 14.0]
    assert slow and fast and min(slow) > 5 * max(fast)


def test_killed_syncer_merges_nothing_while_down_and_loses_nothing_committed(corpus):
    sim, r = run(corpus, "kill:syncer@8+4")
    rounds = of(sim, "round_closed")
    assert rounds and not of(sim, "round_closed", lo=8.0, hi=12.0)
    assert of(sim, "round_closed", lo=12.0)
    assert [e.t for e in of(sim, "restored")] == [12.0]
    # versions go on from where they were: every committed merge survived the restart
    for p in range(SMALL["P"]):
        versions = [e.data.version for e in rounds if e.data.fragment == p]
        assert versions == list(range(1, len(versions) + 1))
    # learners trained on, were not healed again, and resumed with the restarted syncer
    assert len(of(sim, "healed")) == SMALL["learners"] and len(of(sim, "reconnected")) == 3
    assert all(e.data.lost_committed_rounds == 0 for e in of(sim, "seen_check"))
    assert of(sim, "sent", lo=8.0, hi=12.0) and r.tokens >= SimConfig(**SMALL).budget_tokens()


def test_faults_after_the_run_change_nothing(corpus):
    base_sim, base = run(corpus, "", steps=8)
    sim, r = run(corpus, "kill:L1@900+1,cut:L0@950+1,kill:syncer@990+1", steps=8)
    assert r.eval_loss == base.eval_loss and r.wall_time_s == base.wall_time_s
    assert sim.events == base_sim.events and sim.faults.skipped == 3


def test_data_parallel_stops_for_a_killed_worker(corpus):
    cfg = SimConfig(**{**SMALL, "steps": 8, "method": "data_parallel"})
    base = run_data_parallel(cfg, corpus=corpus)
    hit = run_data_parallel(dataclasses.replace(cfg, scenario="kill:L1@3+5"), corpus=corpus)
    assert hit.failures == 1 and base.failures == 0
    assert hit.wall_time_s > base.wall_time_s + 4.0


def test_sim_cli_runs_a_scenario_file_and_reports_what_it_did(tmp_path, capsys):
    from atoll.cli import main as atoll_main

    path = tmp_path / "s.toml"
    path.write_text('[[fault]]\nkind = "kill"\ntarget = "L1"\nat = 2.0\nduration = 1.0\n')
    sets = [f"--set={k}={v}" for k, v in {**SMALL, "steps": 6}.items()]
    out = tmp_path / "out"
    rc = atoll_main(["sim", *sets, "--scenario", str(path), "--out", str(out), "--no-plot"])
    assert rc == 0
    runs = {r["name"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    chaos = runs["decoupled"]["chaos"]
    assert chaos["applied"] == {"kill": 1} and chaos["scenario"] == str(path)
    assert runs["decoupled"]["failures"] == 1 and runs["data_parallel"]["failures"] == 1
    assert runs["decoupled"]["settings"]["scenario"] == str(path)
    assert "1 of 1 faults applied (kill 1)" in capsys.readouterr().out
    assert atoll_main(["sim", *sets, "--scenario", str(tmp_path / "none.toml")]) == 2
