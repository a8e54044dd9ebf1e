"""Every event the code emits is one of the closed set, with its record's fields: checked
statically over the source, so that a rarely taken path (an error handler) cannot raise."""

import ast
import dataclasses
from pathlib import Path

from atoll.core.events import KINDS

SRC = Path(__file__).resolve().parents[2] / "src" / "atoll"


def _emits():
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("emit", "record")  # EventLog.emit, SyncerRuntime.record
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                yield path.relative_to(SRC), node.lineno, node.args[0].value, node.keywords


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
