"""The exception types a user sees: bad input (`ConfigError`), a learner that cannot join its
syncer or go on (`LearnerError`: `AuthError`, `JoinError`, `JoinTimeoutError`, `CommError`),
and a run that cannot go on (`RunError`). Each message is one line saying why and what to do:
the command line prints it as is (exit 2); the library raises it, never exits."""

EXIT_STORE = 65  # the syncer cannot restore its run (EX_DATAERR): restarting it cannot help


class ConfigError(ValueError):
    """A setting has a value atoll cannot use.

    The message always names the setting, the value given and what is allowed, so the
    command line can print it as is.
    """

    def __init__(self, setting: str, value: object, allowed: str) -> None:
        self.setting = setting
        self.value = value
        self.allowed = allowed
        super().__init__(f"{setting}={value!r} is not allowed: {allowed}")


class LearnerError(RuntimeError):
    """`atoll.Learner` cannot join its syncer or go on; the subclasses say why."""


class AuthError(LearnerError, ConnectionError):
    """The syncer refused the learner's call: another shared secret, run id or protocol
    version. Retrying cannot help; raised within a second of the refusal."""


class JoinError(LearnerError, ConnectionError):
    """The syncer answered but the learner cannot join it: it refused the learner (taken for
    another shard), its Welcome cannot be used, or its model is not the learner's."""


class JoinTimeoutError(LearnerError, TimeoutError):
    """No heal within the join timeout (`Learner(connect_timeout_s=...)`, the `join_timeout_s`
    setting): no syncer answered at the address (the message says what the last attempt met,
    e.g. connection refused), or it answered and sent no heal."""


class CommError(LearnerError):
    """A learner's communication side is gone (its process killed, a thread dead, the syncer
    refused it): raised from `Learner.step()`, so that the process stops loudly and its
    supervisor restarts it (it then heals from the syncer)."""


class RunError(RuntimeError):
    """A run that cannot go on as it is (its syncer cannot read the state it left on disk);
    the message says why and what to do. Nothing on disk has been changed."""


def restore_hint(run_dir: object, why: str) -> str:
    """What a user is told when the state a run left on disk cannot be restored."""
    return (
        f"the run in {run_dir} cannot be restored: {why}. Nothing on disk was changed. A file "
        "that could not be read may be whole once its disk or permissions are mended: resume "
        "then; one that is corrupt can be kept to inspect, and tape/ and snapshot.safetensors "
        "moved away to start the run afresh"
    )
