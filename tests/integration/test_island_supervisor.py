"""`atoll island -- CMD`: the island's supervisor, on small shell commands in place of torchrun.
It restarts a failed command with backoff and with torchrun's store made per rendezvous round,
stops on success and on user errors, and forwards SIGTERM to the command's process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def island(*args: str, **kw) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "atoll.cli", "island", *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)  # fmt: skip


def test_a_failing_command_runs_again_with_backoff_until_it_succeeds(tmp_path):
    """Each start sees the store opt-out and its restart count; the third start succeeds."""
    script = ('echo "$ATOLL_ISLAND_RESTART $TORCH_DISABLE_SHARE_RDZV_TCP_STORE $(date +%s.%N)"; '
              '[ "$ATOLL_ISLAND_RESTART" = 2 ] || exit 1')  # fmt: skip
    p = island("--backoff", "0.3", "--", "sh", "-c", script)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    runs = [line.split() for line in out.splitlines()]
    assert [r[:2] for r in runs] == [["0", "1"], ["1", "1"], ["2", "1"]], out
    gaps = [float(b[2]) - float(a[2]) for a, b in zip(runs, runs[1:])]
    assert gaps[0] >= 0.3 and gaps[1] >= 0.6, gaps  # 0.3 s, then doubled
    assert err.count("atoll island: exit 1 after") == 2 and "restart 2/10 in 0.6 s" in err, err


def test_it_gives_up_after_max_restarts_with_the_command_s_exit_code():
    p = island("--max-restarts", "2", "--backoff", "0", "--", "sh", "-c", "echo run; exit 7")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 7 and out.count("run") == 3, (out, err)
    assert err.splitlines()[-1] == "atoll island: exit 7; 2 restarts done, giving up"


def test_a_user_error_is_not_restarted():
    """Exit 2, or a bad setting the atoll CLI reports (under torchrun, whose own exit is 1,
    it writes the line to ATOLL_ISLAND_STOP)."""
    p = island("--backoff", "0", "--", "sh", "-c", "echo run; exit 2")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and out.count("run") == 1, (out, err)
    bad = f"{sys.executable} -m atoll.cli island --max-restarts -1 -- true; exit 1"
    p = island("--backoff", "0", "--", "sh", "-c", bad)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and err.count("--max-restarts=-1 is not allowed") == 2, err
    assert "atoll island: not restarted: a user error (atoll island: --max-restarts=-1" in err


def test_sigterm_reaches_the_whole_process_group_and_ends_the_supervisor(tmp_path):
    """The command's child (as torchrun's ranks are) gets the SIGTERM too; no restart."""
    marks, ready = tmp_path / "marks", tmp_path / "ready"
    child = (f"trap 'echo child >> {marks}; exit 0' TERM; touch {ready}; "
             "while :; do sleep 0.05; done")  # fmt: skip
    script = f"trap 'echo parent >> {marks}; wait; exit 143' TERM; sh -c \"{child}\" & wait"
    p = island("--backoff", "0", "--", "sh", "-c", script)
    until = time.time() + 30
    while not ready.exists():  # both traps are set
        assert time.time() < until and p.poll() is None, p.communicate()
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 143, err
    assert sorted(marks.read_text().split()) == ["child", "parent"]
    assert "restart" not in err, err


STATIC = "python -m torch.distributed.run --rdzv_backend=static --max_restarts=1 x.py"


def test_bad_arguments_are_one_line():
    for args, says in [
        ((), "command='' is not allowed: a command after `--`"),
        (("--max-restarts", "-1", "--", "true"), "--max-restarts=-1 is not allowed"),
        (("--", "/no/such/command"), "command='/no/such/command' is not allowed"),
        # torchrun's static rendezvous (no --standalone, no --rdzv-backend) cannot restart
        (
            ("--", "torchrun", "--nproc-per-node=2", "--max-restarts", "3", "train.py"),
            "torchrun --max-restarts='3' is not allowed: 0 with torchrun's static rendezvous",
        ),
        (("--", *STATIC.split()), "torchrun --max-restarts='1' is not allowed"),
    ]:
        p = island(*args)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 2 and err.count("\n") == 1 and says in err, (args, err)
        assert err.startswith("atoll island: error: "), err


def test_torchrun_restarts_with_their_own_store_per_round_are_allowed():
    from atoll.live.island_cli import check_torchrun

    for cmd in (
        ["torchrun", "--standalone", "--nproc-per-node=2", "--max-restarts=3", "train.py"],
        ["torchrun", "--rdzv-backend", "c10d", "--max-restarts", "3", "train.py"],
        ["torchrun", "--max-restarts=0", "train.py", "--max-restarts", "5"],  # the script's
        ["python", "-m", "torch.distributed.run", "-m", "atoll.cli", "--max-restarts", "1"],
    ):
        check_torchrun(cmd)


def test_the_environment_of_the_command_is_kept(tmp_path):
    env = {**os.environ, "MY_SETTING": "kept"}
    p = island("--", "sh", "-c", "echo $MY_SETTING", env=env)
    assert p.communicate(timeout=60)[0].strip() == "kept"


def test_torchrun_beside_this_python_is_found_without_the_environment_on_path(tmp_path):
    """`.venv/bin/atoll island -- torchrun ...` with the environment not active: the command is
    taken from the bin directory of the Python atoll runs in."""
    env = {**os.environ, "PATH": str(tmp_path)}  # neither torchrun nor python on PATH
    bindir = Path(sys.executable).parent
    assert (bindir / "torchrun").exists()
    p = island("--max-restarts", "0", "--", "torchrun", "--help", env=env)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and "--nproc-per-node" in out, err[-2000:]
