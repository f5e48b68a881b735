"""Fixtures for runtime tests (the project and the serving runtime are in tests/conftest.py)."""

from __future__ import annotations

import pytest
import trio
import trio.testing


@pytest.fixture
def virtual_clock() -> trio.testing.MockClock:
    """Virtual time for deadline tests that also touch the SQLite store. The store answers on
    a worker thread, which leaves the trio loop idle; with a zero threshold the clock would
    jump to the next deadline while a write is still in flight. A short real idle threshold
    keeps virtual time still until the thread answers, and still skips every long wait."""
    return trio.testing.MockClock(autojump_threshold=0.05)
