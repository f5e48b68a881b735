"""Shared test helpers (imported by the test modules next to this file)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar

from maple_acp.runtime import RunEvent

E = TypeVar("E")


async def next_event(events: AsyncIterator[RunEvent], kind: type[E]) -> E:
    """Read events until one of ``kind``; fail if the run ends first."""
    async for event in events:
        if isinstance(event, kind):
            return event
    raise AssertionError(f"the run ended without a {kind.__name__}")


def of_type(events: list[RunEvent], kind: type[E]) -> list[E]:
    return [event for event in events if isinstance(event, kind)]


def exists(path: Path) -> bool:
    """Whether ``path`` exists (a sync helper: the tests check files between awaits)."""
    return os.path.exists(path)
