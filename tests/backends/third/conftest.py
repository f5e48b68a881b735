"""The third engine's tests talk to the OpenAI-compatible tests' loopback server (raw replies),
whose directory is put on the import path here."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "openai"))

from loopback import LoopbackProvider


@pytest.fixture
async def lines_server() -> AsyncIterator[LoopbackProvider]:
    server = LoopbackProvider()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        nursery.cancel_scope.cancel()
