"""What atoll uses from Python 3.11's standard library, on Python 3.10 as well.

`tomllib` is the `tomli` package on 3.10 (its source; a dependency there only). `StrEnum` on
3.10 behaves as 3.11's for what atoll does with it: members are strs, and str() and format()
give the value (a plain `(str, Enum)` says "Cls.NAME" for str())."""

import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum  # novm

    import tomllib  # novm
else:
    from enum import Enum

    import tomli as tomllib

    class StrEnum(str, Enum):
        """enum.StrEnum of Python 3.11."""

        def __str__(self) -> str:
            return str.__str__(self)

        def __format__(self, spec: str) -> str:
            return str.__format__(self, spec)

        def _generate_next_value_(name, start, count, last_values):  # auto(): the lowercase name
            return name.lower()


__all__ = ["StrEnum", "tomllib"]
