"""Fixtures for backend tests: a serving demo runtime over a real SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from maple_acp.runtime import AgentService
from maple_acp.testing.demo import demo_service


@pytest.fixture
def project(tmp_path: Path) -> Path:
    directory = tmp_path / "project"
    directory.mkdir()
    return directory


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[AgentService]:
    data = tmp_path / "data"
    data.mkdir()
    async with demo_service(data, relay_allow_list=("MAPLE_TOKEN",)) as svc:
        yield svc
