"""Fixtures for the end-to-end tests; starting and driving processes lives in
``host_processes``, which test modules import from.

The few names re-exported below keep the ``from .conftest import ...`` lines of the update
tests working.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .host_processes import (
    DEADLINE,
    assert_only_protocol_lines,
    connector_client,
    private_short_dir,
    running_host,
)
from .interop_clients import install_sdk

__all__ = ["DEADLINE", "assert_only_protocol_lines", "connector_client", "running_host"]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private scratch directory with a short path: a socket path must fit in sun_path."""
    with private_short_dir() as path:
        yield path


@pytest.fixture
def project(short_dir: Path) -> Path:
    directory = short_dir / "project"
    directory.mkdir()
    return directory


@pytest.fixture(scope="session")
def ts_sdk(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TypeScript SDK's folder, installed once per run (``interop_clients``): skips the
    test, with the reason, without node, npm or the registry."""
    return install_sdk(pytestconfig, tmp_path_factory.mktemp("npm"))
