"""The OpenAI-compatible kind as the registry sees it (``openai`` in the ``maple_acp.engines``
entry points): what it needs installed, its engine, and ``GET /models`` for its providers'
model lists. The SDK is imported by neither, only made ready in a worker thread."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager

from maple_acp.backends.openai._backend import ProviderBackend
from maple_acp.backends.openai._client import SdkLoader, open_provider_client
from maple_acp.backends.provider import (
    OPENAI_KIND,
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
    "pip install -e '.[openai]' in a checkout of maple-acp, "
    "or pip install 'maple-acp[openai]' from a package index"
)


class ModelsEndpoint(ModelListing):
    """``GET /models`` with a Bearer key, through the SDK (imported once, by ``sdk``)."""

    def __init__(self, sdk: SdkLoader) -> None:
        self._sdk = sdk

    async def ready(self) -> None:
        await self._sdk.ready()

    @asynccontextmanager
    async def open_models(
        self, entry: ProviderEntry, key: str | None, timeouts: RequestTimeouts, tls: TlsContext
    ) -> AsyncIterator[AsyncIterable[object]]:
        async with open_provider_client(entry, key, timeouts, tls) as client:
            yield (model.id async for model in client.models.list())


class OpenAIKind(EngineKind):
    """Chat Completions endpoints: OpenAI, OpenRouter, vLLM, llama.cpp, LM Studio, Ollama."""

    name = OPENAI_KIND
    title = "OpenAI-compatible"
    requires = ("openai", "httpx2")
    install = INSTALL_HINT

    def build(
        self, config: ProviderConfig, keys: ProviderKeys, options: EngineOptions
    ) -> BuiltEngine:
        # One import of the SDK, in a worker thread, for the backend and the model lists alike.
        sdk = SdkLoader()
        backend = ProviderBackend(config, keys, sdk=sdk, **options.shell())
        return BuiltEngine(backend, ModelsEndpoint(sdk))

    def listing(self) -> ModelListing:
        return ModelsEndpoint(SdkLoader())


#: What the ``openai`` entry point names.
ENGINE_KIND = OpenAIKind()
