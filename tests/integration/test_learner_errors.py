"""What stops a learner's start is one line, at once, as a typed exception (atoll.LearnerError),
never an exit of the caller's process: a secret the syncer refuses (`AuthError`, in thread and
child-process mode, found by the check before the communication side joins or by the
communication side itself), a syncer that refuses the learner (`JoinError`), and a syncer that
is not there (`JoinTimeoutError` after the join timeout, each attempt said meanwhile as
"connection refused at HOST:PORT, retrying (n)", not a line per attempt). The live syncer in
this process (the `live` fixture) or no syncer at all."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest
import torch

import atoll
from atoll.live.address import free_port
from atoll.live.learner import joining
from atoll.model.recipe import new_model
from tests.helpers import CFG, RUN, SECRET


def _learner(address, **kw):
    model = new_model(CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    kw = {"run_id": RUN, "secret": SECRET, "comm": "thread", "connect_timeout_s": 60, **kw}
    return atoll.Learner(model, opt, address, atoll.LearnerOptions(learner_id="L0", **kw))


def _comm_threads():
    return [t for t in threading.enumerate() if t.name.startswith("atoll-")]


@pytest.mark.parametrize("comm", ["thread", "process"])
@pytest.mark.parametrize("checked", [True, False], ids=["checked-first", "by-the-comm-side"])
def test_a_wrong_secret_is_an_auth_error_at_once(live, monkeypatch, comm, checked):
    """Before: a ConnectionError traceback (`atoll learner`: 16 s on a busy host). Now an
    AuthError of one line, raised at the first refusal, not after retries or the join timeout:
    the syncer refused at most two calls (the check and one Join)."""
    service, _, _, _ = live
    if not checked:  # the communication side's own path: its Join is refused
        monkeypatch.setattr(joining, "check_secret", lambda *a, **k: None)
    address = f"127.0.0.1:{service.port}"
    t0 = time.monotonic()
    with pytest.raises(atoll.AuthError) as err:
        _learner(address, secret="not-the-secret-123", comm=comm)
    took = time.monotonic() - t0
    msg = str(err.value)
    assert isinstance(err.value, atoll.LearnerError) and isinstance(err.value, ConnectionError)
    assert "\n" not in msg and msg.startswith("learner L0: ") and address in msg, msg
    assert "missing or wrong shared secret" in msg and "ATOLL_SECRET" in msg, msg
    assert 1 <= service.auth.refused <= 2, service.auth.refused  # no retry loop
    assert took < 10, took  # the join timeout is 60 s
    assert not _comm_threads()  # the communication side is gone


def test_another_run_id_is_an_auth_error_naming_it(live):
    service, _, _, _ = live
    with pytest.raises(atoll.AuthError, match=r"run id 'another-run' is not this run's"):
        _learner(f"127.0.0.1:{service.port}", run_id="another-run")


def test_an_unreachable_syncer_is_said_as_it_retries_then_given_up_after_the_join_timeout(
    caplog,
):
    """Before: silent for 60 s, then `TimeoutError: no heal from the syncer`. Now each Join
    that finds nothing is said on the atoll.learner logger (the first at once, then every 5 s
    at most) and the start gives up after connect_timeout_s with one line naming what the last
    attempt met and how many there were."""
    address = f"127.0.0.1:{free_port()}"
    caplog.set_level(logging.WARNING, logger="atoll.learner")
    t0 = time.monotonic()
    with pytest.raises(atoll.JoinTimeoutError) as err:
        _learner(address, connect_timeout_s=3)
    took = time.monotonic() - t0
    msg = str(err.value)
    assert isinstance(err.value, atoll.LearnerError) and isinstance(err.value, TimeoutError)
    assert "\n" not in msg and f"connection refused at {address}: no syncer answered" in msg, msg
    assert "join timeout of 3 s" in msg, msg
    attempts = int(re.search(r"\((\d+) attempts\)", msg).group(1))
    assert attempts >= 3, msg  # retried with backoff (0.2 s doubling), not once
    said = [r.getMessage() for r in caplog.records if r.name == "atoll.learner"]
    assert said and said[0] == f"learner L0: connection refused at {address}, retrying (1)", said
    assert len(said) <= 2 < attempts, said  # rate-limited: not a line per attempt
    assert 3 <= took < 10, took
    assert not _comm_threads()


def test_a_syncer_given_as_a_shard_it_is_not_is_a_join_error(live):
    """The live syncer is unsharded; taken for shard 0 of 2 it refuses the Join."""
    service, _, _, _ = live
    address = f"127.0.0.1:{service.port},127.0.0.1:{free_port()}"
    with pytest.raises(atoll.JoinError) as err:
        _learner(address, connect_timeout_s=30)
    msg = str(err.value)
    assert "\n" not in msg and "this syncer is shard 0/1" in msg and "shard order" in msg, msg


@pytest.mark.parametrize("syncer", ["", "host", "host:", ":7070", "host:99999", "a:1,b"])
def test_a_malformed_address_is_a_config_error_before_anything_starts(syncer):
    with pytest.raises(atoll.ConfigError, match=r"^syncer=.* host:port"):
        _learner(syncer)
    assert not _comm_threads()


def test_a_syncer_whose_port_is_taken_stops_with_one_line(live, tmp_path, monkeypatch, capsys):
    from atoll.cli import main as atoll_main

    service, _, _, _ = live
    monkeypatch.setenv("ATOLL_SECRET", SECRET)
    argv = ["syncer", "--run-dir", str(tmp_path / "second"), "--view", "off", "--no-budget"]
    rc = atoll_main([*argv, "--set", f"port={service.port}", "--set", "eval=false"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"host:port='127.0.0.1:{service.port}' is not allowed" in err, err
