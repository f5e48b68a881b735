"""Fixtures for the task-store tests: a real SQLite file under ``tmp_path``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from maple_acp.store import SqliteTaskStore
from maple_acp.testing.store import STORE_FILE_NAME, temp_store


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / STORE_FILE_NAME


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteTaskStore]:
    async with temp_store(tmp_path) as opened:
        yield opened
