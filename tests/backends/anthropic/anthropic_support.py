"""Helpers the Anthropic backend tests share: a configuration naming the loopback server as a
``kind = "anthropic"`` provider, and a real ACP service or runtime over a real SQLite file whose
backend talks to it through the real ``anthropic`` SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from messages_loopback import MessagesProvider

from maple_acp.backends import ProviderConfig, build_backend, load_provider_config
from maple_acp.backends import provider_policy as policy
from maple_acp.runtime import AgentService
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service
from maple_acp.testing.service import AcpHarness, running_demo_acp
from maple_acp.testing.store import temp_store

#: The key the tests configure; every secrecy test searches for it.
TEST_KEY = "sk-ant-test-0a1b2c3d4e5f60718293a4b5c6d7e8f9"
KEY_ENV = "TEST_ANTHROPIC_KEY"
#: Prices (USD per million tokens) of the priced model.
PRICES = {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75}


def messages_config(
    provider: MessagesProvider, *, prices: bool = False, context_window: int = 200_000
) -> ProviderConfig:
    """Provider ``claude`` with model ``test-model`` (window ``context_window``, thinking
    levels, and ``PRICES`` when ``prices``)."""
    model: dict[str, Any] = {
        "id": "test-model",
        "reasoning": True,
        "context_window": context_window,
    }
    if prices:
        model["prices"] = PRICES
    raw = {
        "providers": [
            {
                "name": "claude",
                "kind": "anthropic",
                "base_url": provider.base_url,
                "api_key_env": KEY_ENV,
                "models": [model],
            }
        ]
    }
    return load_provider_config(raw, "test config")


@asynccontextmanager
async def messages_acp(
    tmp_path: Path, provider: MessagesProvider, *, prices: bool = False
) -> AsyncIterator[AcpHarness]:
    backend, catalog = build_backend(
        messages_config(provider, prices=prices), {KEY_ENV: TEST_KEY}, backoff=(0.0,)
    )
    async with (
        backend,
        running_demo_acp(tmp_path, backend=backend, catalog=catalog, policy=policy()) as h,
    ):
        yield h


@asynccontextmanager
async def messages_service(
    tmp_path: Path,
    provider: MessagesProvider,
    *,
    prices: bool = False,
    context_window: int = 200_000,
    **backend_options: Any,
) -> AsyncIterator[AgentService]:
    backend, catalog = build_backend(
        messages_config(provider, prices=prices, context_window=context_window),
        {KEY_ENV: TEST_KEY},
        **{"backoff": (0.0,), **backend_options},
    )
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    async with backend, temp_store(data) as store:
        service = make_demo_service(store, backend=backend, catalog=catalog, policy=policy())
        async with service:
            service.sign_in(DEMO_ACCOUNT)
            yield service
