"""No import cycle among atoll's modules: the import graph of src/atoll, read with `ast`,
counting every import (inside functions and `if TYPE_CHECKING:` blocks too), has no cycle."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _module(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """atoll module -> the atoll modules it imports (`from package import name` counts as
    the submodule `name` when there is one, else as the package)."""
    paths = {_module(p, src): p for p in sorted((src / "atoll").rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for mod, path in paths.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                sub = [f"{base}.{a.name}" for a in node.names]  # names, or submodules
                targets = [t if t in paths else base for t in sub]
            for t in targets:
                while t and t not in paths:  # the longest prefix that is an atoll module
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_cycle_finder_finds_a_type_checking_only_cycle(tmp_path):
    pkg = tmp_path / "atoll"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from atoll.b import B\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from atoll import a\n"
    )
    (pkg / "c.py").write_text("from . import a\n")
    graph = import_graph(tmp_path)
    assert graph["atoll.c"] == {"atoll.a"}
    assert cycles(graph) == [["atoll.a", "atoll.b"]]


def test_no_import_cycle_among_atoll_modules():
    found = cycles(import_graph())
    assert found == [], f"import cycles among atoll modules: {found}"


# (importer package, package it must not import): the layers go one way
ONE_WAY = [
    ("atoll.live.comm", "atoll.live.learner"),  # the learner drives its communication side
    ("atoll.core", "atoll.live"),  # the core is sans-I/O: the drivers call it
    ("atoll.core", "atoll.sim"),
    ("atoll.live", "atoll.sim"),  # what both drivers use lives outside sim/
]
ALLOWED = {("atoll.live.run_cli", "atoll.sim.decoupled")}  # `atoll run --compare-sim`


def test_packages_import_one_way():
    graph = import_graph()
    inside = lambda m, pkg: m == pkg or m.startswith(pkg + ".")  # noqa: E731
    wrong = sorted(
        (m, t)
        for m, targets in graph.items()
        for t in targets
        for a, b in ONE_WAY
        if inside(m, a) and inside(t, b) and (m, t) not in ALLOWED
    )
    assert wrong == [], f"imports against the layers: {wrong}"
