"""The layout of the whole package, read from its source: no import circle of any kind, no
import of another package's private module, only the arrows between floors that
docs/architecture.md allows ("Floors and arrows": the table is read from there, so the page and
the code cannot disagree), and no module longer than ``MAX_MODULE_LINES``.

Every import counts: module level, inside a function (a lazy import is still an arrow), and
under ``TYPE_CHECKING`` (a type-only circle is still a circle for the reader). ``from pkg import
name`` is an arrow to ``pkg.name`` when that is a module, else to ``pkg`` itself (its
``__init__``, the package's public face).
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import maple_acp
import maple_acp_connector

ROOT = Path(__file__).parents[1]
PACKAGES = {
    "maple_acp": Path(maple_acp.__file__).parent,
    "maple_acp_connector": Path(maple_acp_connector.__file__).parent,
}
ARCHITECTURE = ROOT / "docs" / "architecture.md"
ARROWS_HEADING = "## Floors and arrows"

#: Private reaches and import circles still allowed, each a named exception (none left: the
#: provider layer's engines stand on ``maple_acp.backends.provider`` and never on each other).
#: The lists only shrink: an entry that is no longer found fails the test.
KNOWN_BACKEND_REACHES: set[tuple[str, str]] = set()
KNOWN_BACKEND_CIRCLES: set[frozenset[str]] = set()

#: The longest a module may be: a module past it holds more than one concern, and the next
#: feature lands in it rather than in a home of its own.
MAX_MODULE_LINES = 600
#: Modules still longer, each waiting for its own split (none left: the commands of
#: ``maple-acp`` each stand in a module of their own). The list only shrinks: an entry that is no
#: longer too long fails the test.
KNOWN_LONG_MODULES: set[str] = set()

#: The module of each listener (the Unix socket's, the network's): both in the shape of
#: ``maple_acp.listeners.Listener``, beside each other, neither inside the edge they serve.
LISTENERS: Final = {"unix": "maple_acp.listeners._unix", "network": "maple_acp.net._server"}
#: The module holding that shape, which both stand on.
LISTENER_SHAPE: Final = "maple_acp.listeners._shape"


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for top, directory in PACKAGES.items():
        for path in directory.rglob("*.py"):
            parts = [top, *path.relative_to(directory).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _known_module(name: str) -> str | None:
    """``name`` or its nearest enclosing module of ours (``None``: not ours)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(importer: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {m for alias in node.names if (m := _known_module(alias.name))}
    if node.level:
        base = importer.split(".")
        if MODULES[importer].name != "__init__.py":
            base.pop()
        base = base[: len(base) - node.level + 1]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    found: set[str] = set()
    for alias in node.names:
        submodule = f"{source}.{alias.name}"
        target = submodule if submodule in MODULES else _known_module(source)
        if target:
            found.add(target)
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Each module of ours and the modules of ours it imports, anywhere in its file."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                targets |= _targets(name, node)
        graph[name] = targets - {name}
    return graph


def circles(graph: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The modules of each import circle (strongly connected components larger than one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def private_reaches(graph: Mapping[str, Iterable[str]]) -> set[tuple[str, str]]:
    """Imports of a private module (``_x``, or anything below one) from outside the package
    that holds it. ``__main__`` and other dunder names are not private."""
    found: set[tuple[str, str]] = set()
    for importer, targets in graph.items():
        for target in targets:
            parts = target.split(".")
            private = next(
                (i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")),
                None,
            )
            if private is None:
                continue
            owner = ".".join(parts[:private])
            if importer != owner and not importer.startswith(owner + "."):
                found.add((importer, target))
    return found


def reachable(graph: Mapping[str, Iterable[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others (``start`` not included)."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen - {start}


def defined_names(path: Path) -> set[str]:
    """The names a module defines at its top level (classes, functions, assignments)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
    return names


def floor_modules(name: str) -> list[str]:
    return [module for module in MODULES if floor(module) == name]


def names_imported_from(modules: Iterable[str], source: str) -> set[str]:
    """The names ``modules`` import with ``from source import ...``, anywhere in their files."""
    names: set[str] = set()
    for module in modules:
        path = MODULES[module]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == source:
                names |= {alias.name for alias in node.names}
    return names


def long_modules(paths: Mapping[str, Path], limit: int) -> dict[str, int]:
    """The modules longer than ``limit`` lines, with their length."""
    lengths = {name: len(path.read_text().splitlines()) for name, path in paths.items()}
    return {name: lines for name, lines in lengths.items() if lines > limit}


def floor(module: str) -> str:
    """The floor a module stands on: the connector, the package's face, or the first name
    below ``maple_acp`` (a subpackage or a top-level module)."""
    parts = module.split(".")
    if parts[0] == "maple_acp_connector":
        return "connector"
    return parts[1] if len(parts) > 1 else "maple_acp"


def floor_arrows(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    arrows: dict[str, set[str]] = {}
    for importer, targets in graph.items():
        for target in targets:
            if floor(importer) != floor(target):
                arrows.setdefault(floor(importer), set()).add(floor(target))
    return arrows


def allowed_arrows(text: str) -> dict[str, set[str]]:
    """The table under "Floors and arrows": each row names a floor (first column, in
    backticks) and the floors it may import (second column, in backticks; "—" for none)."""
    section = text.split(ARROWS_HEADING, 1)[1].split("\n## ", 1)[0]
    allowed: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        targets = set(re.findall(r"`([^`]+)`", cells[1]))
        for name in names:
            allowed[name] = targets
    return allowed


# -- the rules --------------------------------------------------------------------------------


def test_the_walk_sees_every_kind_of_import() -> None:
    graph = import_graph()
    # A module-level import, a TYPE_CHECKING one and a lazy one, as the package has them today.
    assert "maple_acp.runtime._run" in graph["maple_acp.runtime._lease"]
    assert "maple_acp.runtime._turn" in graph["maple_acp.runtime._backend"]  # TYPE_CHECKING
    assert "maple_acp.cli._doctor" in graph["maple_acp.cli._commands"]  # inside doctor()
    assert "maple_acp_connector.__main__" in graph["maple_acp._main"]  # inside main()


def test_no_import_circle_of_any_kind() -> None:
    found = set(circles(import_graph()))
    assert found - KNOWN_BACKEND_CIRCLES == set()
    assert KNOWN_BACKEND_CIRCLES - found == set(), "a known circle is gone: delete its entry"


def test_no_module_imports_another_packages_private_module() -> None:
    found = private_reaches(import_graph())
    assert sorted(found - KNOWN_BACKEND_REACHES) == []
    assert sorted(KNOWN_BACKEND_REACHES - found) == [], "a known reach is gone: delete its entry"


def test_only_the_arrows_the_architecture_page_allows() -> None:
    allowed = allowed_arrows(ARCHITECTURE.read_text())
    floors = {floor(module) for module in MODULES}
    assert floors - allowed.keys() == set(), "a floor the architecture page does not list"
    wrong = {
        (importer, target)
        for importer, targets in floor_arrows(import_graph()).items()
        for target in targets
        if target not in allowed.get(importer, set())
    }
    assert sorted(wrong) == []


def test_the_runtime_imports_no_acp_floor() -> None:
    """The runtime knows no ACP word: a host UI uses it without loading the edge."""
    arrows = floor_arrows(import_graph())
    assert arrows["runtime"].isdisjoint({"edge", "rpc", "wire", "mcp", "backends", "cli"})


def test_no_module_is_longer_than_the_limit() -> None:
    found = long_modules(MODULES, MAX_MODULE_LINES)
    assert {name: found[name] for name in sorted(found.keys() - KNOWN_LONG_MODULES)} == {}
    assert sorted(KNOWN_LONG_MODULES - found.keys()) == [], "a long module was split: delete it"


def test_the_unix_and_network_listeners_stand_beside_each_other() -> None:
    """Both listeners stand outside the edge on the one listener shape, and neither reaches
    the other or the edge: they run beside it (``RunningListeners``) and hand it their
    connections."""
    graph = import_graph()
    allowed = allowed_arrows(ARCHITECTURE.read_text())
    unix, network = LISTENERS["unix"], LISTENERS["network"]
    assert floor(unix) != floor(network)
    for listener in (unix, network):
        assert listener in MODULES, listener
        assert floor(listener) != "edge"
        assert "edge" not in allowed[floor(listener)], floor(listener)
        found = reachable(graph, listener)
        assert LISTENER_SHAPE in found, listener
        assert {floor(module) for module in found}.isdisjoint({"edge", "cli"}), listener
    assert network not in reachable(graph, unix)
    # The network reaches the Unix listener's package through its face only (no private
    # reach), and takes from it the shared shape and accept rule, never the Unix listener.
    unix_names = defined_names(MODULES[unix])
    taken = names_imported_from(floor_modules("net"), "maple_acp.listeners")
    assert taken, "the network listener stands on the listener shape"
    assert taken.isdisjoint(unix_names), sorted(taken & unix_names)
    assert floor(LISTENER_SHAPE) in allowed["edge"]
    # The edge opens no listener and serves none: from their floor it takes the shape, the
    # errors and ``RunningListeners`` (which serves them beside it), never a listener (nor
    # does it reach the network's).
    edge_takes = names_imported_from(floor_modules("edge"), "maple_acp.listeners")
    listeners = importlib.import_module("maple_acp.listeners")
    opened = {
        name
        for name in edge_takes & unix_names
        if not (isinstance(kind := getattr(listeners, name), type) and issubclass(kind, Exception))
    }
    assert not opened, sorted(opened)
    for module in floor_modules("edge"):
        assert all(floor(found) != "net" for found in reachable(graph, module)), module
        source = Path(importlib.import_module(module).__file__ or "").read_text()
        assert ".serve(self" not in source.replace("peer.serve(", ""), module


# -- the checks check ---------------------------------------------------------------------------


def test_the_circle_finder_finds_a_circle_and_only_it() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert circles(graph) == [frozenset({"a", "b", "c"})]


def test_a_private_module_is_private_to_its_own_package() -> None:
    graph = {
        "maple_acp.edge._service": {"maple_acp.store._lock", "maple_acp._groups"},
        "maple_acp.store._sqlite": {"maple_acp.store._lock"},
        "maple_acp.cli._commands": {"maple_acp_connector.__main__"},
    }
    assert private_reaches(graph) == {("maple_acp.edge._service", "maple_acp.store._lock")}


def test_the_arrow_table_is_read_from_the_page() -> None:
    allowed = allowed_arrows(ARCHITECTURE.read_text())
    assert allowed["wire"] <= {"_exceptions", "_text"}
    assert "edge" not in allowed["runtime"]
    assert allowed["connector"] == set()


def test_reachable_follows_imports_through_other_modules() -> None:
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": set(), "d": {"a"}}
    assert reachable(graph, "a") == {"b", "c"}
    assert reachable(graph, "c") == set()


def test_a_module_past_the_limit_is_found_and_one_at_it_is_not(tmp_path: Path) -> None:
    at_limit = tmp_path / "at.py"
    at_limit.write_text("x = 1\n" * MAX_MODULE_LINES)
    past = tmp_path / "past.py"
    past.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    paths = {"pkg.at": at_limit, "pkg.past": past}
    assert long_modules(paths, MAX_MODULE_LINES) == {"pkg.past": MAX_MODULE_LINES + 1}
