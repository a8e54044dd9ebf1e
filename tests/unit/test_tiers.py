"""The test tiers stay honest: tests/unit imports nothing that opens sockets, starts
processes or speaks gRPC, and asks for no fixture that does; every module of tests/e2e is
marked slow; every test module is in a tier. Read from the sources (ast), not by running them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "e2e")

# what a pure test must not import: sockets, processes, threads, gRPC and the clients built on it
FORBIDDEN_ROOTS = {
    "asyncio", "concurrent", "grpc", "multiprocessing", "signal", "socket", "subprocess",
    "threading",
}  # fmt: skip
FORBIDDEN_MODULES = {"atoll.live.client", "atoll.live.launcher", "atoll.wire.atoll_pb2_grpc"}
# fixtures (tests/conftest.py) that start a server
FORBIDDEN_FIXTURES = {"live"}


def imported(tree: ast.AST) -> set[str]:
    """Every module a source imports, anywhere in it (`from a import b` gives a and a.b)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def impure_uses(source: str) -> list[str]:
    """What in a test module's source has no place in the unit tier."""
    tree = ast.parse(source)
    bad = sorted(
        n for n in imported(tree) if n.split(".")[0] in FORBIDDEN_ROOTS or n in FORBIDDEN_MODULES
    )
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = {a.arg for a in [*node.args.args, *node.args.kwonlyargs]}
            bad += [f"fixture {a} in {node.name}" for a in sorted(args & FORBIDDEN_FIXTURES)]
    return bad


def _is_slow(node: ast.expr) -> bool:
    if isinstance(node, ast.List | ast.Tuple):
        return any(_is_slow(e) for e in node.elts)
    return ast.unparse(node) in ("pytest.mark.slow", "mark.slow")


def marked_slow(source: str) -> bool:
    """Whether a module sets `pytestmark` to pytest.mark.slow (alone or in a list)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return _is_slow(node.value)
    return False


def _modules(tier: str) -> list[Path]:
    return sorted((TESTS / tier).glob("test_*.py"))


def test_the_checks_catch_what_they_are_for():
    assert impure_uses("import grpc\n") == ["grpc"]
    assert impure_uses("def test_x():\n    import subprocess\n") == ["subprocess"]
    assert impure_uses("from atoll.wire import atoll_pb2_grpc as pbg\n") == [
        "atoll.wire.atoll_pb2_grpc"
    ]
    assert impure_uses("def test_x(live, tmp_path):\n    pass\n") == ["fixture live in test_x"]
    assert impure_uses("import torch\nfrom atoll.core import codec\n") == []
    assert marked_slow("import pytest\npytestmark = pytest.mark.slow\n")
    assert marked_slow("import pytest\npytestmark = [pytest.mark.slow, pytest.mark.skipif(1)]\n")
    assert not marked_slow("import pytest\npytestmark = pytest.mark.skipif(1, reason='x')\n")
    assert not marked_slow("import pytest\n\n@pytest.mark.slow\ndef test_x():\n    pass\n")


@pytest.mark.parametrize("path", _modules("unit"), ids=lambda p: p.name)
def test_unit_tests_open_no_sockets_start_no_processes_and_speak_no_grpc(path: Path):
    assert impure_uses(path.read_text()) == [], f"{path}: move it to tests/integration or e2e"


@pytest.mark.parametrize("path", _modules("e2e"), ids=lambda p: p.name)
def test_end_to_end_modules_are_marked_slow(path: Path):
    assert marked_slow(path.read_text()), f"{path}: add `pytestmark = pytest.mark.slow`"


def test_every_test_module_is_in_a_tier():
    stray = sorted(
        str(p.relative_to(TESTS))
        for p in TESTS.rglob("test_*.py")
        if p.relative_to(TESTS).parts[0] not in TIERS
    )
    assert stray == [], f"put each in tests/unit, tests/integration or tests/e2e: {stray}"
    assert all(_modules(tier) for tier in TIERS)
