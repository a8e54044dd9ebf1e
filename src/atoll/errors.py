"""The one exception type a user sees for bad input."""


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
