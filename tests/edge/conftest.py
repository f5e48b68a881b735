"""Fixtures for edge tests; the harness itself lives in ``edge_harness`` (the project
directory is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from edge_harness import Harness, running_service


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_service(tmp_path) as running:
        yield running
