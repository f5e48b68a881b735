"""Fixtures for edge tests; the harness itself lives in ``edge_harness``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from edge_harness import Harness, running_service

from maple_acp.testing.schema import AcpSchema, find_schema_dir


@pytest.fixture(scope="session")
def acp_schema() -> AcpSchema:
    directory = find_schema_dir()
    if directory is None:
        pytest.skip("ACP schema not found: set ACP_SCHEMA_DIR to the acp-schema/v1 directory")
    return AcpSchema(directory)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    directory = tmp_path / "project"
    directory.mkdir()
    return directory


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_service(tmp_path) as running:
        yield running
