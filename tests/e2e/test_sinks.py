"""The sinks of `atoll run` and `atoll sim` (--tensorboard DIR, --wandb PROJECT): TensorBoard
event files that tensorboard's own reader loads, and offline W&B runs (no network) read back
with wandb's own reader (`wandb leet inspect --json`), with the run's figures, the same as the
run's summary where both have them; a missing package stops with one line naming its extra."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_sim import TINY

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RUN = ["run", "--set", "learners=2", "--set", "steps=60"]
SIM = ["sim", "--preset", "quick", *[f"--set={k}={v}" for k, v in {**TINY, "steps": 16}.items()],
       "--quiet", "--no-plot"]  # fmt: skip


def atoll(args: list, tmp_path: Path, **env: str | None) -> subprocess.CompletedProcess:
    """`atoll ARGS` in a process; W&B offline, silent, its files under tmp_path (no network,
    nothing in the home directory); `env`: more variables (None: unset)."""
    wb = tmp_path / "wandb-home"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")},
        "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(wb / "config"), "WANDB_CACHE_DIR": str(wb / "cache"),
        "WANDB_DATA_DIR": str(wb / "data"), "WANDB_ERROR_REPORTING": "false", **env,
    }  # fmt: skip
    cmd = [sys.executable, "-m", "atoll.cli", *map(str, args)]
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def wandb_runs(root: Path) -> dict[str, list[dict]]:
    """Every offline W&B run under `root`, by its name: its records, as wandb reads them."""
    out = {}
    for d in sorted(root.glob("wandb/offline-run-*")):
        cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(d)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
        records = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
        (run,) = [r["run"] for r in records if r["type"] == "run"]
        out[run.get("display_name") or run.get("name") or run["run_id"]] = records
    return out


def history(records: list[dict]) -> list[dict]:
    return [r["history"]["item"] for r in records if r["type"] == "history"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One `atoll run` for every check of this module: each sink whose package is installed on
    (a test of a missing one skips), its output a pipe."""
    tmp = tmp_path_factory.mktemp("sinks")
    out = tmp / "r"
    sinks = [*(["--tensorboard", tmp / "tb"] if importlib.util.find_spec("tensorboard") else []),
             *(["--wandb", "atoll-test"] if importlib.util.find_spec("wandb") else [])]  # fmt: skip
    res = atoll([*RUN, "--out", out, *sinks], tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    return out, res


def test_tensorboard_gets_the_runs_figures(run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _res = run
    acc = EventAccumulator(str(out.parent / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"run/tokens", "run/rounds", "run/goodput", "run/eval_loss"} <= tags, tags
    assert {"learner/L0/tokens_per_s", "learner/L1/tokens_per_s"} <= tags
    summary = json.loads((out / "summary.json").read_text())
    losses = acc.Scalars("run/eval_loss")  # the syncer's while the run went, then the final
    assert len(losses) >= 2 and [x.step for x in losses] == sorted(x.step for x in losses)
    assert losses[-1].value == pytest.approx(summary["eval_loss"], rel=1e-6)
    rounds = acc.Scalars("run/rounds")
    assert [s.value for s in rounds] == sorted(s.value for s in rounds)  # counts only grow
    assert rounds[-1].value == summary["rounds"]  # the last figures are the run's
    tokens = acc.Scalars("run/tokens")
    assert tokens[-1].value > 0 and tokens[-1].step == int(tokens[-1].value)


def test_wandb_offline_gets_the_runs_figures(run):
    pytest.importorskip("wandb")
    out, res = run
    assert "W&B: offline run in" in res.stderr and "wandb sync" in res.stderr
    (records,) = wandb_runs(out).values()  # under the run directory: wandb/offline-run-*
    (wb,) = [r["run"] for r in records if r["type"] == "run"]
    assert wb["project"] == "atoll-test" and wb["telemetry"]["feature"]["offline"]
    assert wb["config"]["update"]["learners"] == 2 and wb["config"]["update"]["steps"] == 60
    rows = history(records)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["_step"] for r in rows] == sorted(r["_step"] for r in rows)  # keyed by tokens
    assert all(r["_step"] == r["run/tokens"] for r in rows if "run/tokens" in r)
    last = rows[-1]
    assert last["run/eval_loss"] == pytest.approx(summary["eval_loss"], rel=1e-6)
    assert last["run/rounds"] == summary["rounds"] and last["run/tokens"] > 0
    assert {"run/goodput", "learner/L0/tokens_per_s", "learner/L1/tokens_per_s"} <= set(last)
    assert not any(r["type"] == "stats" for r in records)  # the run's figures only


def test_plain_lines_when_stdout_is_a_pipe(run):
    """The live view of `atoll run` is plain progress lines when stdout is a pipe (its table
    under a terminal: test_view.py)."""
    out, res = run
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("[atoll run] tokens")]
    assert lines, res.stdout[-3000:]
    assert re.search(r"rounds \d+ .*goodput", lines[-1]) and "\x1b[" not in res.stdout
    assert re.search(r"eval \d+\.\d{4} at [\d,]+ tokens", lines[-1]), lines[-1]
    # the last line is the run's figures, as its summary has them (metrics.Figures)
    s = json.loads((out / "summary.json").read_text())
    got = re.search(r"tokens ([\d,]+)/.* rounds (\d+) .*goodput ([\d.]+)%", lines[-1])
    assert got and int(got[1].replace(",", "")) == s["tokens"], (lines[-1], s["tokens"])
    assert int(got[2]) == s["rounds"] and abs(float(got[3]) - 100 * s["goodput"]) <= 0.1


def test_sim_feeds_wandb_one_run_per_method(tmp_path):
    pytest.importorskip("wandb")
    out = tmp_path / "s"
    # the default mode is offline: WANDB_MODE unset, no --wandb-mode
    res = atoll([*SIM, "--out", out, "--wandb", "atoll-sim"], tmp_path, WANDB_MODE=None)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = wandb_runs(out)
    results = {r["name"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert set(runs) == set(results) == {"decoupled", "data_parallel"}
    for name, records in runs.items():
        (run,) = [r["run"] for r in records if r["type"] == "run"]
        assert run["telemetry"]["feature"]["offline"] and run["run_group"] == "s"
        rows, r = history(records), results[name]
        losses = [(x["_step"], x["run/eval_loss"]) for x in rows if "run/eval_loss" in x]
        assert losses == [(c["tokens"], pytest.approx(c["eval_loss"])) for c in r["curve"]]
        assert rows[-1]["run/tokens"] == r["tokens"]
        assert rows[-1]["run/goodput"] == pytest.approx(r["goodput"])
    assert runs["decoupled"][-1]["type"] == "exit"


def shadowed(tmp_path: Path, package: str) -> dict[str, str]:
    """An environment in which `import PACKAGE` fails as if it were not installed."""
    d = tmp_path / "shadow" / package
    d.mkdir(parents=True)
    (d / "__init__.py").write_text(f'raise ImportError("No module named {package!r}")\n')
    return {"PYTHONPATH": os.pathsep.join([str(d.parent), str(ROOT / "src")])}


@pytest.mark.parametrize("flag,package", [("--tensorboard", "tensorboard"), ("--wandb", "wandb")])
@pytest.mark.parametrize("command", ["run", "sim"])
def test_a_missing_package_stops_with_one_line_naming_its_extra(tmp_path, flag, package, command):
    out = tmp_path / "o"
    res = atoll(
        [command, flag, "x", "--out", out, "--quiet"], tmp_path, **shadowed(tmp_path, package)
    )
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"pip install 'atoll[{package}]'" in lines[0], lines
    assert not out.exists()  # nothing started, nothing computed


def test_a_sink_that_fails_is_said_once_and_the_others_go_on(tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from atoll.sinks import close_all, feed, open_sinks

    for k, v in {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                 "WANDB_CONFIG_DIR": str(tmp_path / "wbc"), "WANDB_ERROR_REPORTING": "false",
                 "WANDB_CACHE_DIR": str(tmp_path / "wbk")}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    sinks = open_sinks(str(tmp_path / "tb"), "atoll-test", str(tmp_path))
    tb, wb = sinks
    feed(sinks, 10, {"run/rounds": 1.0})
    wb.run.finish()  # wandb's run is gone from under the sink: its next log raises
    feed(sinks, 20, {"run/rounds": 2.0})
    feed(sinks, 30, {"run/rounds": 3.0})
    assert sinks == [tb]
    err = [ln for ln in capsys.readouterr().err.splitlines() if "sink failed" in ln]
    assert len(err) == 1 and "the wandb sink failed" in err[0] and "goes on" in err[0], err
    close_all(sinks)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("run/rounds")] == [(10, 1), (20, 2), (30, 3)]
