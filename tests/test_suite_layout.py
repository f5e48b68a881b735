"""The suite's own layout: most test directories are not packages, so pytest imports each of
their modules by its base name, and a second ``test_x.py`` in another such directory stops the
whole run at collection ("import file mismatch"). A module inside a package (a directory with
an ``__init__.py``, like tests/e2e) is imported by its dotted name instead."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).parent


def import_name(path: Path) -> str:
    """The name pytest imports ``path`` under (its packages' names before it)."""
    parts = [path.stem]
    directory = path.parent
    while (directory / "__init__.py").exists():
        parts.insert(0, directory.name)
        directory = directory.parent
    return ".".join(parts)


def test_every_module_of_the_suite_has_a_name_of_its_own() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name != "conftest.py" and "__pycache__" not in path.parts:
            where[import_name(path)].append(path.relative_to(TESTS).as_posix())
    assert len(where) > 100, "the walk found too few modules to be a real check"
    assert {name: dirs for name, dirs in where.items() if len(dirs) > 1} == {}
