"""The exception types a user sees: bad input (`ConfigError`), and a learner whose link to
the syncer can no longer work (`CommError`)."""


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


class CommError(RuntimeError):
    """A learner's communication side is gone (its process killed, a thread dead, the syncer
    refused it): raised from `Learner.step()`, so that the process stops loudly and its
    supervisor restarts it (it then heals from the syncer)."""
