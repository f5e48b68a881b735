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
from typing import Any, Final

import deadlines
import pytest
from hypothesis import HealthCheck, settings

from maple_acp.runtime import AgentService
from maple_acp.testing.demo import demo_service
from maple_acp.testing.schema import AcpSchema
from maple_acp.testing.schema_source import SCHEMA_ENV, SchemaUnavailable, resolve_schema_dir

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


def require_schema(env: Mapping[str, str], **where: Any) -> Path:
    """The ACP schema directory, found or fetched (:mod:`maple_acp.testing.schema_source`),
    or a usage error of one line naming ``ACP_SCHEMA_DIR``: a run that skipped the schema
    tests would pass without checking a single frame, so there is no skipping."""
    try:
        return resolve_schema_dir(env, **where)
    except SchemaUnavailable as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_configure(config: pytest.Config) -> None:
    """Decide the schema before collecting (and before the user's environment is swapped out:
    the cache is the user's), and pass it on through ``ACP_SCHEMA_DIR`` to every module and
    process that looks."""
    os.environ[SCHEMA_ENV] = os.fspath(require_schema(os.environ))
    deadlines.configure(config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Every test has a hard bound (tests/deadlines.py)."""
    with deadlines.hard_bound(item):
        yield


# First, so that pytest-trio's own wrapper then wraps the guarded test function.
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A Trio test fails with its tasks' stacks after its real-time deadline."""
    deadlines.guard(item)
    yield


#: Variables that opt in to the live provider tests (tests/backends/openai/test_provider_live.py).
LIVE_TEST_PREFIX: Final = "MAPLE_ACP_LIVE_"
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
    directories (created 0700), and no ``MAPLE_ACP_*`` setting from outside (the live
    provider tests' own ``MAPLE_ACP_LIVE_*`` variables aside: they are how one opts in)."""
    isolated = {
        key: value
        for key, value in env.items()
        if not key.startswith("MAPLE_ACP_") or key.startswith(LIVE_TEST_PREFIX)
    }
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
    return AcpSchema(Path(os.environ[SCHEMA_ENV]))


@pytest.fixture(scope="session")
def acp_schema_v2() -> AcpSchema:
    """The ACP v2 draft schema: ``v2`` beside the v1 directory (both sources hold it)."""
    return AcpSchema(Path(os.environ[SCHEMA_ENV]).parent / "v2")


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
