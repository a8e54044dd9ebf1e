"""The example configs in examples/ load and pass every check `atoll run` makes before it
starts a process (settings, per-learner values, the chaos scenario, islands and batch)."""

from pathlib import Path

import pytest

from atoll import chaos
from atoll.config import load_job

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))


def test_the_examples_are_there():
    names = {p.stem for p in EXAMPLES}
    assert {"demo", "heterogeneous", "chaos", "custom_model", "multihost"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_an_example_passes_the_checks_a_run_makes(path):
    job = load_job([], str(path))
    n = job.run.learners
    live = job.live.validate()
    live.shape_factors(n)
    sizes = live.island_sizes(n)
    assert all(job.sim.batch % s == 0 for s in sizes)
    spec = live.chaos or job.sim.scenario
    if spec:
        timeline = chaos.load(spec, live.restart_delay_s).validate(n).timeline(n, 60.0, 0)
        assert timeline  # the faults it describes are scheduled
    text = path.read_text()
    assert text.lstrip().startswith("#") and "atoll" in text.split("[")[0]  # says how to run it


def test_the_demo_file_is_the_demo():
    from atoll.live.demo_cli import DEMO

    job = load_job([], str(next(p for p in EXAMPLES if p.stem == "demo")))
    flat = {**vars(job.run), **vars(job.sim), **vars(job.live)}
    for key, value in DEMO.items():
        assert flat.get(key) == value, key
