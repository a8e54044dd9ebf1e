"""Every event the code emits is one of the closed set, with its record's fields: checked
statically over the source, so that a rarely taken path (an error handler) cannot raise."""

import ast
import dataclasses
from pathlib import Path

from atoll.core.events import KINDS

SRC = Path(__file__).resolve().parents[1] / "src" / "atoll"


_BY_NAME = {cls.__name__: kind for kind, cls in KINDS.items()}


def _records(tree: ast.Module) -> dict[str, str]:
    """The record classes a module imports from atoll.core.events: local name -> kind."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "atoll.core.events":
            for a in node.names:
                if a.name in _BY_NAME:
                    out[a.asname or a.name] = _BY_NAME[a.name]
    return out


def _emits():
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        records = _records(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("emit", "record")  # EventLog.emit, SyncerRuntime.record
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and not (len(node.args) > 1 and isinstance(node.args[1], ast.Call))  # typed
            ):
                yield path.relative_to(SRC), node.lineno, node.args[0].value, node.keywords
            elif (  # a typed record made by name (EventLog.record(source, Record(...)))
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in records
                and not node.args
            ):
                yield path.relative_to(SRC), node.lineno, records[node.func.id], node.keywords


def test_every_emitted_kind_and_field_is_defined():
    found = list(_emits())
    assert len(found) > 20  # the live syncer, learners, comm side and launcher emit
    for path, line, kind, keywords in found:
        assert kind in KINDS, f"{path}:{line}: event kind {kind!r} is not in core.events"
        fields = {f.name: f for f in dataclasses.fields(KINDS[kind])}
        given = {k.arg for k in keywords if k.arg is not None}
        assert given <= set(fields), f"{path}:{line}: {kind} has no field {given - set(fields)}"
        required = {
            n
            for n, f in fields.items()
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        if all(k.arg is not None for k in keywords):  # no **spread: every field is named
            assert required <= given, f"{path}:{line}: {kind} lacks {required - given}"
