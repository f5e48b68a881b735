"""Fixtures for the Anthropic backend: a loopback Messages server (in its own nursery). It
builds on the OpenAI-compatible loopback server, whose directory is put on the import path
here. ``project`` comes from tests/conftest.py."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "openai"))

from messages_loopback import MessagesProvider


@pytest.fixture
async def messages_provider() -> AsyncIterator[MessagesProvider]:
    server = MessagesProvider()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        nursery.cancel_scope.cancel()
