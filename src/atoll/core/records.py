"""The machinery of the event stream (core/events.py holds its vocabulary): `Record`, the
base of every event kind's data; `kind`, which makes a class one kind of the closed set
`KINDS`; and `Event(t, source, record)`, read and written as `{"t", "kind", "source",
"data"}`. Import these from atoll.core.events, whose import defines the kinds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

KINDS: dict[str, type[Record]] = {}


class Record:
    """The data of one event kind. Fields read as attributes, or as `record["field"]`."""

    KIND: ClassVar[str] = ""

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def to_dict(self) -> dict[str, Any]:
        """The fields, less those at a default of None (a None without a default is written:
        `Event.from_dict` needs every field that has no default)."""
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if v is not None or f.default is dataclasses.MISSING:
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out


def kind(name: str):
    def wrap(cls: type) -> type:
        cls = dataclass(frozen=True)(cls)
        cls.KIND = name
        if name in KINDS:
            raise ValueError(f"event kind {name!r} defined twice")
        KINDS[name] = cls
        return cls

    return wrap


@dataclass(frozen=True)
class Event:
    t: float
    source: str
    data: Record

    @property
    def kind(self) -> str:
        return self.data.KIND

    @staticmethod
    def make(t: float, kind: str, source: str, **fields: Any) -> Event:
        """An event of a named kind; unknown kinds and fields are refused (TypeError/KeyError
        naming them)."""
        cls = KINDS.get(kind)
        if cls is None:
            raise KeyError(f"event kind {kind!r} is not one of atoll.core.events.KINDS")
        return Event(t, source, cls(**fields))

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Event:
        return Event.make(d["t"], d["kind"], d["source"], **d.get("data", {}))

    def to_dict(self) -> dict[str, Any]:
        return {"t": self.t, "kind": self.kind, "source": self.source, "data": self.data.to_dict()}
