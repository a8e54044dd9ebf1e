"""Every event record the code makes is given its record's fields: checked statically over the
source, so that a rarely taken path (an error handler) cannot raise. (Events are typed records
only: `EventLog` has no way to write one by a kind's name.)"""

import ast
import dataclasses
from pathlib import Path

from atoll.core.events import KINDS

SRC = Path(__file__).resolve().parents[2] / "src" / "atoll"


RECORDS = {cls.__name__: kind for kind, cls in KINDS.items()}


def _emits():
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        typed = {  # the record classes this module imports (other modules have namesakes)
            (x.asname or x.name): RECORDS[x.name]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "atoll.core.events"
            for x in node.names
            if x.name in RECORDS
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            where = path.relative_to(SRC), node.lineno
            if isinstance(node.func, ast.Name) and node.func.id in typed:  # a typed record
                kind = typed[node.func.id]
                names = [f.name for f in dataclasses.fields(KINDS[kind])]
                if any(isinstance(a, ast.Starred) for a in node.args):
                    named = [ast.keyword(arg=None, value=ast.Constant(None))]  # a spread
                else:
                    named = [
                        ast.keyword(arg=names[i] if i < len(names) else f"#{i}", value=a)
                        for i, a in enumerate(node.args)
                    ]
                yield *where, kind, named + node.keywords


def test_every_event_record_is_made_with_its_fields():
    found = list(_emits())
    assert len(found) > 40  # the core, both drivers, the comm side and the launcher make them
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
