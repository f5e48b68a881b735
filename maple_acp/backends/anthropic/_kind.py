"""The Anthropic kind as the registry sees it (``anthropic`` in the ``maple_acp.engines``
entry points): what it needs installed, its engine, and ``GET /v1/models`` through the SDK for
its providers' model lists. The SDK is imported only in a worker thread."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager

import trio

from maple_acp.backends.anthropic._backend import AnthropicBackend
from maple_acp.backends.anthropic._client import import_sdk, open_messages_client
from maple_acp.backends.provider import (
    ANTHROPIC_KIND,
    BuiltEngine,
    EngineKind,
    EngineOptions,
    ModelListing,
    ProviderConfig,
    ProviderEntry,
    ProviderKeys,
    RequestTimeouts,
    TlsContext,
)

#: How to install the SDK: from a checkout, or from a package index.
INSTALL_HINT = (
    "pip install -e '.[anthropic]' in a checkout of maple-acp, "
    "or pip install 'maple-acp[anthropic]' from a package index"
)


class MessagesModels(ModelListing):
    """``GET /v1/models`` with the SDK's key header and ``anthropic-version``."""

    def __init__(self) -> None:
        self._imported = False

    async def ready(self) -> None:
        if not self._imported:
            await trio.to_thread.run_sync(import_sdk, abandon_on_cancel=True)
            self._imported = True

    @asynccontextmanager
    async def open_models(
        self, entry: ProviderEntry, key: str | None, timeouts: RequestTimeouts, tls: TlsContext
    ) -> AsyncIterator[AsyncIterable[object]]:
        async with open_messages_client(entry, key, timeouts, tls) as client:
            yield (model.id async for model in client.models.list())


class AnthropicKind(EngineKind):
    """Anthropic's Messages API."""

    name = ANTHROPIC_KIND
    title = "Anthropic"
    requires = ("anthropic", "httpx2")
    install = INSTALL_HINT

    def build(
        self, config: ProviderConfig, keys: ProviderKeys, options: EngineOptions
    ) -> BuiltEngine:
        return BuiltEngine(AnthropicBackend(config, keys, **options.shell()), MessagesModels())

    def listing(self) -> ModelListing:
        return MessagesModels()


#: What the ``anthropic`` entry point names.
ENGINE_KIND = AnthropicKind()
