"""Fixtures for the provider backend: a loopback OpenAI-compatible server (in its own nursery)
and a real runtime over a real SQLite file whose backend talks to it through the real SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from loopback import LoopbackProvider

from maple_acp.backends.openai import (
    build_backend,
    provider_config_from_flags,
    provider_policy,
)
from maple_acp.runtime import AgentService
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service
from maple_acp.testing.store import temp_store

#: The key the tests configure; every secrecy test searches for it.
TEST_KEY = "sk-test-9f8e7d6c5b4a39281706f5e4d3c2b1a0"


@pytest.fixture
async def provider() -> AsyncIterator[LoopbackProvider]:
    server = LoopbackProvider()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        nursery.cancel_scope.cancel()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    directory = tmp_path / "project"
    directory.mkdir()
    return directory


@pytest.fixture
async def service(tmp_path: Path, provider: LoopbackProvider) -> AsyncIterator[AgentService]:
    async with provider_service(tmp_path, provider) as svc:
        yield svc


@asynccontextmanager
async def provider_service(
    tmp_path: Path,
    provider: LoopbackProvider,
    *,
    context_window: int | None = None,
    relay_allow_list: tuple[str, ...] = (),
    **backend_options: Any,
) -> AsyncIterator[AgentService]:
    """A signed-in ``AgentService`` with the provider backend (model ``provider/test-model``,
    key ``TEST_KEY``) over a store in ``tmp_path/data``."""
    config = provider_config_from_flags(
        provider.base_url,
        "test-model",
        api_key_env="TEST_PROVIDER_KEY",
        context_window=context_window,
    )
    backend, catalog = build_backend(config, {"TEST_PROVIDER_KEY": TEST_KEY}, **backend_options)
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    async with temp_store(data) as store:
        service = make_demo_service(
            store,
            backend=backend,
            catalog=catalog,
            policy=provider_policy(),
            relay_allow_list=relay_allow_list,
        )
        async with service:
            service.sign_in(DEMO_ACCOUNT)
            yield service
