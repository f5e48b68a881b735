"""Fixtures for the provider backend: a loopback OpenAI-compatible server (in its own nursery)
and a real runtime over a real SQLite file whose backend talks to it through the real SDK.
``project`` comes from tests/conftest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from loopback import LoopbackProvider
from provider_support import provider_service

from maple_acp.runtime import AgentService


@pytest.fixture
async def provider() -> AsyncIterator[LoopbackProvider]:
    server = LoopbackProvider()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        nursery.cancel_scope.cancel()


@pytest.fixture
async def service(tmp_path: Path, provider: LoopbackProvider) -> AsyncIterator[AgentService]:
    async with provider_service(tmp_path, provider) as svc:
        yield svc
