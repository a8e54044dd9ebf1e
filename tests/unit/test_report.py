"""`atoll report` on a tiny `atoll sim` run (its end writes the report), and its errors."""

from atoll.cli import main as atoll_main
from tests.report_checks import assert_every_plot_drawn
from tests.unit.test_sim import TINY


def test_sim_writes_a_report_with_every_plot_drawn(tmp_path, capsys):
    out = tmp_path / "sim"
    sets = [f"--set={k}={v}" for k, v in {**TINY, "steps": 16}.items()]
    # a learner killed at 2 s (virtual): failures and rejoins on the timeline
    rc = atoll_main(["sim", "--preset", "quick", *sets, "--set=scenario=kill:L1@2+1",
                     "--out", str(out), "--quiet"])  # fmt: skip
    assert rc == 0
    assert f"report: {out / 'report.html'}" in capsys.readouterr().out
    assert_every_plot_drawn(out / "report.html")
    text = (out / "report.html").read_text()
    assert "data_parallel" in text and "No sync_diloco run in this directory" in text
    # `atoll report` itself, to another file: the same plots
    assert atoll_main(["report", str(out), "--out", str(tmp_path / "r.html")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "r.html")
    assert_every_plot_drawn(tmp_path / "r.html")


def test_missing_or_foreign_run_dir_stops_with_one_line(tmp_path, capsys):
    assert atoll_main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope" in err and "events.jsonl" in err
    (tmp_path / "other").mkdir()
    assert atoll_main(["report", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err.strip()
    assert "other" in err and "results.json" in err and "neither" in err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{not json")
    assert atoll_main(["report", str(tmp_path / "bad")]) == 2
    assert "reading it failed" in capsys.readouterr().err


def test_a_report_that_cannot_be_written_is_one_warning_line_not_a_failure(tmp_path, capsys):
    from atoll.report import try_report

    try_report(tmp_path / "gone")  # what `atoll demo` and `atoll sim` call when they end
    out = capsys.readouterr().out.strip()
    assert out.startswith("atoll: warning: the report of") and len(out.splitlines()) == 1


def test_the_header_names_the_islands_among_the_learners():
    from atoll.core.events import Event, Training
    from atoll.report.data import _learners

    events = [Event(1.0, "L0", Training("a", 0.1)), Event(1.0, "L1", Training("b", 0.1, 2))]
    assert _learners(["L0", "L1"], events) == "2 (islands: L1 2 ranks)"
    assert _learners(["L0"], events[:1]) == "1"
