"""Fixtures for runtime tests: a serving demo runtime over a real SQLite file, and a project
directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing

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
    async with demo_service(data, relay_allow_list=("MAPLE_TOKEN", "PATH")) as svc:
        yield svc


@pytest.fixture
def virtual_clock() -> trio.testing.MockClock:
    """Virtual time for deadline tests that also touch the SQLite store. The store answers on
    a worker thread, which leaves the trio loop idle; with a zero threshold the clock would
    jump to the next deadline while a write is still in flight. A short real idle threshold
    keeps virtual time still until the thread answers, and still skips every long wait."""
    return trio.testing.MockClock(autojump_threshold=0.05)
