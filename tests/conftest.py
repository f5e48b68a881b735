"""Shared test configuration: the user's environment kept out of every test (one session-wide
fixture), the ACP schema (found or fetched at start, never skipped), Hypothesis profiles, and
the fixtures most directories share (a project directory, a serving demo runtime over a real
SQLite file)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Final

import pytest
from hypothesis import HealthCheck, settings

from maple_acp.runtime import AgentService
from maple_acp.testing.demo import demo_service
from maple_acp.testing.schema import AcpSchema, find_schema_dir

# The default suite replays the same examples on every run, so a CI verdict depends on the
# code and not on the draw; the "long" profile (nox -s long) explores with fresh randomness.
settings.register_profile(
    "default",
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long",
    deadline=None,
    max_examples=5000,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

#: Values of ``CI`` that mean "this is a CI run" (CI services set ``CI=true``).
_CI_VALUES = frozenset({"1", "true", "yes"})


def schema_problem(env: Mapping[str, str]) -> str | None:
    """Why a CI run cannot check frames against the ACP schema, or ``None`` if it can."""
    if env.get("CI", "").strip().lower() not in _CI_VALUES:
        return None
    explicit = env.get("ACP_SCHEMA_DIR")
    if explicit and not (Path(explicit) / "schema.json").is_file():
        return f"CI is set but ACP_SCHEMA_DIR={explicit} holds no schema.json"
    if find_schema_dir() is None:
        return (
            "CI is set but the ACP schema was not found: set ACP_SCHEMA_DIR to the directory "
            "holding schema.json (acp-schema/v1)"
        )
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Under CI a missing ACP schema stops the run: locally the schema tests skip with a
    reason, but a CI run that skipped them would pass without checking a single frame."""
    problem = schema_problem(os.environ)
    if problem is not None:
        raise pytest.UsageError(problem)


#: The user's base directories a test must never read or write: each gets a private stand-in.
USER_DIRS: Final[Mapping[str, str]] = {
    "HOME": "home",
    "XDG_CONFIG_HOME": "home/.config",
    "XDG_DATA_HOME": "home/.local/share",
    "XDG_STATE_HOME": "home/.local/state",
    "XDG_CACHE_HOME": "home/.cache",
    "XDG_RUNTIME_DIR": "run",
}


def isolated_environment(base: Path, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as a fresh account under ``base`` would have it: its own home and XDG base
    directories (created 0700), and no ``MAPLE_ACP_*`` setting from outside."""
    isolated = {key: value for key, value in env.items() if not key.startswith("MAPLE_ACP_")}
    for name, relative in USER_DIRS.items():
        directory = base / relative
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        isolated[name] = os.fspath(directory)
    return isolated


@pytest.fixture(scope="session", autouse=True)
def isolated_user() -> Iterator[Path]:
    """Every test, and every process a test starts (they inherit ``os.environ``), runs as a
    fresh account: a config file, data directory, socket or ``MAPLE_ACP_*`` variable of the
    user running the suite changes nothing. The home is a short path: sockets live under it."""
    base = Path(tempfile.mkdtemp(prefix="macp-user-"))
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(isolated_environment(base, saved))
    try:
        yield base / USER_DIRS["HOME"]
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def acp_schema() -> AcpSchema:
    directory = find_schema_dir()
    if directory is None:
        pytest.skip("ACP schema not found: set ACP_SCHEMA_DIR to the acp-schema/v1 directory")
    return AcpSchema(directory)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An empty project directory (the end-to-end tests use one with a shorter path)."""
    directory = tmp_path / "project"
    directory.mkdir()
    return directory


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[AgentService]:
    """A serving demo runtime over a real SQLite file; ``MAPLE_TOKEN`` and ``PATH`` may be
    relayed."""
    data = tmp_path / "data"
    data.mkdir()
    async with demo_service(data, relay_allow_list=("MAPLE_TOKEN", "PATH")) as svc:
        yield svc
