"""The engine's seams, held by reading the source: no ``hasattr``/``getattr`` probe of a
backend's (or a catalog's) members anywhere in the package, engine packages imported by no
module but their own (the registry finds them through their entry points), and
``maple_acp.engine`` re-exporting only what its ``__all__`` names, none of it a host's."""

from __future__ import annotations

import ast
from pathlib import Path

import maple_acp
import maple_acp.engine

PACKAGE = Path(maple_acp.__file__).resolve().parent

#: The members of the backend protocol (and the catalog's start-up check) that were once
#: looked for by name.
PROTOCOL_MEMBERS = frozenset(
    {
        "run_turn",
        "available_commands",
        "thought_levels",
        "prompt_capabilities",
        "accepts_images",
        "warm_up",
        "aclose",
        "__aenter__",
        "__aexit__",
        "check_providers",
        "pending_checks",
    }
)
#: The engine packages: only the registry (through entry points) and they themselves name them.
ENGINE_PACKAGES = ("maple_acp.backends.openai", "maple_acp.backends.anthropic")


def probes(source: str) -> list[str]:
    """Each ``hasattr(x, NAME)`` / ``getattr(x, NAME[, default])`` whose subject is called a
    backend or whose ``NAME`` is a protocol member, as ``line: text``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("hasattr", "getattr")
            and len(node.args) >= 2
        ):
            continue
        subject = ast.unparse(node.args[0])
        name = node.args[1]
        member = name.value if isinstance(name, ast.Constant) else None
        if "backend" in subject.lower() or member in PROTOCOL_MEMBERS:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append((name, path))
    return found


def test_the_probe_finder_sees_the_probes_it_looks_for() -> None:
    # The shapes the runtime, the router and the host once had.
    source = """
available = getattr(backend, "available_commands", None)
warm_up = getattr(self._backends[0], "warm_up", None)
if hasattr(backend, "__aenter__"):
    pass
probing = hasattr(catalog, "check_providers")
declared = getattr(self._backend(model_id), "accepts_images", None)
status = getattr(exc, "status_code", None)
"""
    assert len(probes(source)) == 5


def test_no_backend_is_probed_for_its_members() -> None:
    found = {
        name: hits for name, path in modules() if (hits := probes(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_engine_packages_are_imported_only_by_themselves() -> None:
    reaching = []
    for name, path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for engine in ENGINE_PACKAGES:
                own = name == engine or name.startswith(f"{engine}.")
                if not own and any(t == engine or t.startswith(f"{engine}.") for t in targets):
                    reaching.append(f"{name} imports {engine}")
    assert reaching == []


def test_the_engine_surface_is_re_exports_for_engine_authors_only() -> None:
    exported = set(maple_acp.engine.__all__)
    assert exported == {name for name in vars(maple_acp.engine) if not name.startswith("_")}
    # What an engine writes and what its turn hands it...
    assert {"Backend", "Turn", "TurnResult", "TurnFailed", "ToolState", "EngineKind"} <= exported
    # ...and nothing a host holds.
    assert not exported & {"AgentService", "SessionLease", "SqliteTaskStore", "AcpService"}
    tree = ast.parse(Path(maple_acp.engine.__file__).read_text(encoding="utf-8"))
    assert all(isinstance(node, (ast.ImportFrom, ast.Assign, ast.Expr)) for node in tree.body), (
        "re-exports only"
    )
