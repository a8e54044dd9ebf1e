"""`atoll run`'s checks before it starts anything (in this process: nothing is spawned)."""


def test_run_refuses_a_directory_that_already_holds_a_run(tmp_path, capsys):
    from atoll.cli import main as atoll_main

    (tmp_path / "tape").mkdir()
    rc = atoll_main(["run", "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "already holds a run" in err and "--resume" in err
