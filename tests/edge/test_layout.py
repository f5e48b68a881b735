"""The edge's module layout: flows get what they use, never the connection, and no module of
``maple_acp/edge`` reaches another in a circle — ``TYPE_CHECKING`` imports included, because a
type-only circle is still a circle for the reader."""

from __future__ import annotations

import ast
from pathlib import Path

import maple_acp.edge

EDGE = Path(maple_acp.edge.__file__).parent
PACKAGE = "maple_acp.edge"
#: The one module that builds connections.
CONNECTION_BUILDERS = {"_service"}


def _edge_imports(path: Path) -> set[str]:
    """Every edge module ``path`` imports, anywhere in the file (``TYPE_CHECKING`` blocks and
    function bodies included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.level == 0 and node.module.startswith(PACKAGE + "."):
                found.add(node.module.removeprefix(PACKAGE + ".").split(".")[0])
            elif node.level == 0 and node.module == PACKAGE:
                found.update(alias.name for alias in node.names)
            elif node.level == 1:
                found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name.removeprefix(PACKAGE + ".").split(".")[0])
    return found


def _graph() -> dict[str, set[str]]:
    modules = {path.stem: path for path in EDGE.glob("*.py") if path.stem != "__init__"}
    return {name: _edge_imports(path) & modules.keys() - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each module that is on one (depth-first search, grey nodes)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_import_cycle_inside_edge_type_checking_imports_included() -> None:
    graph = _graph()
    assert graph.get("_connection"), "the walk found no edge imports"
    assert _cycles(graph) == []


def test_no_edge_module_but_the_service_imports_the_connection() -> None:
    importers = {name for name, imports in _graph().items() if "_connection" in imports}
    assert importers <= CONNECTION_BUILDERS


def test_the_cycle_finder_finds_a_type_only_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
