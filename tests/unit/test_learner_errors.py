"""A learner's start errors, without a syncer: the address check, the exception for each kind of
communication failure (one line, a typed `atoll.LearnerError`), and `atoll learner`'s one line
and exit 2 for an address that cannot be one (before anything is loaded or asked)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import atoll
from atoll.cli import main as atoll_main
from atoll.live.address import check_addresses
from atoll.live.comm.messages import CommFailed
from atoll.live.learner.joining import failure


def test_the_exceptions_a_user_catches():
    for cls in (atoll.AuthError, atoll.JoinError, atoll.JoinTimeoutError, atoll.CommError):
        assert issubclass(cls, atoll.LearnerError) and issubclass(cls, RuntimeError)
    # what a caller caught before stays caught
    assert issubclass(atoll.AuthError, ConnectionError)
    assert issubclass(atoll.JoinError, ConnectionError)
    assert issubclass(atoll.JoinTimeoutError, TimeoutError)


def test_addresses_are_host_and_port():
    assert check_addresses("127.0.0.1:7070") == ["127.0.0.1:7070"]
    assert check_addresses("[::1]:7070") == ["[::1]:7070"]
    assert check_addresses("h0:1, h1:65535") == ["h0:1", "h1:65535"]
    for bad in ("", " ", "host", "host:", ":7070", "host:0", "host:65536", "host:x", "a:1,"):
        with pytest.raises(atoll.ConfigError, match=r"^syncer=.* host:port with a port in"):
            check_addresses(bad)
    with pytest.raises(atoll.ConfigError, match=r"^--syncer='' "):
        check_addresses("", "--syncer")


@pytest.mark.parametrize(
    ("kind", "cls", "says"),
    [
        ("auth", atoll.AuthError, "the syncer at h:1 refused it (missing or wrong shared secret)"),
        ("refused", atoll.JoinError, "the syncer at h:1 refused it: this syncer is shard 0/1"),
        ("unusable", atoll.JoinError, "the syncer's Welcome cannot be used"),
        ("", atoll.CommError, "the communication process ended"),
    ],
)
def test_each_kind_of_failure_is_its_exception_in_one_line(kind, cls, says):
    reason = {
        "auth": "syncer refused us: missing or wrong shared secret",
        "refused": "syncer refused us: this syncer is shard 0/1",
        "unusable": "the syncer's Welcome cannot be used: Welcome.H=0",
        "": "the communication process ended",
    }[kind]
    learner = SimpleNamespace(id="L3", address="h:1", _comm=SimpleNamespace(run_id="r"))
    exc = failure(learner, CommFailed(reason, kind))
    assert type(exc) is cls and str(exc).startswith("learner L3: ") and says in str(exc), exc
    assert "\n" not in str(exc)


@pytest.mark.parametrize("syncer", ["", "host", "host:99999"])
def test_atoll_learner_with_a_malformed_address_says_one_line(syncer, capsys):
    rc = atoll_main(["learner", "--syncer", syncer])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"atoll learner: error: --syncer={syncer!r} is not allowed: host:port")
