"""The edge's own layout rule: flows get what they use, never the connection. (No circle
anywhere in the package, ``TYPE_CHECKING`` imports included, is tests/test_package_layout.py's
rule; this test reads the same import graph.)"""

from __future__ import annotations

from test_package_layout import import_graph

PACKAGE = "maple_acp.edge"
#: The one module that builds connections, and the package's face (which re-exports its
#: constants).
CONNECTION_BUILDERS = {f"{PACKAGE}._service", PACKAGE}


def test_no_edge_module_but_the_service_imports_the_connection() -> None:
    graph = import_graph()
    importers = {name for name, imports in graph.items() if f"{PACKAGE}._connection" in imports}
    assert importers, "the walk found no importer of the connection"
    assert importers <= CONNECTION_BUILDERS


def test_the_two_dialects_stand_side_by_side() -> None:
    # What both versions share lives in the dialect seam: neither version is built on the
    # other, so a third one starts from the seam, not from a copy of either.
    graph = import_graph()
    v1, v2 = f"{PACKAGE}._v1", f"{PACKAGE}._v2"
    assert v1 in graph, "the walk found no v1 dialect module"
    assert v2 in graph, "the walk found no v2 dialect module"
    assert v2 not in graph[v1]
    assert v1 not in graph[v2]
    # The seam names neither version nor a projector built on one.
    seam = graph[f"{PACKAGE}._dialect"]
    assert not seam & {v1, v2, f"{PACKAGE}._projection"}
