"""The HTTP side: one SDK client per turn over our own ``httpx2`` client (no ambient proxy or
environment settings, no redirects, explicit timeouts), and the model catalog read from the
configuration or discovered from ``GET /models``."""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
import httpx2
import openai
import trio

from maple_acp._groups import single_exception
from maple_acp.backends.openai._config import ProviderConfig, ProviderEntry
from maple_acp.runtime import MODEL_DISCOVERY_BOUND_S, ModelInfo

if TYPE_CHECKING:
    from maple_acp.backends.openai._probe import ProviderCheck

logger = logging.getLogger(__name__)

#: Sent as the key to a server that needs none (the SDK always sends one; local servers
#: ignore it).
NO_KEY = "no-key"
#: Words in a model id that mark a model no chat request can use.
_NOT_CHAT = ("embed", "whisper", "tts", "dall-e", "moderation", "rerank", "transcribe")
#: The SDK adds the headers listed in this environment variable to every request.
_AMBIENT_HEADERS = "OPENAI_CUSTOM_HEADERS"
#: Models kept from one provider's discovery.
MAX_DISCOVERED_MODELS = 1024


@attrs.frozen(kw_only=True)
class RequestTimeouts:
    """Bounds on each HTTP request to a provider. ``read`` is the longest silence allowed
    inside a stream: a model may think for a while before its first token."""

    connect: float = 10.0
    read: float = 120.0
    write: float = 30.0
    pool: float = 10.0

    def for_httpx(self) -> httpx2.Timeout:
        return httpx2.Timeout(
            connect=self.connect, read=self.read, write=self.write, pool=self.pool
        )


class ProviderKeys:
    """The API keys, read once from the environment at start. Held only in memory; never in a
    repr, a log line or an error."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, str | None]) -> None:
        self._keys = dict(keys)

    def key_for(self, provider: str) -> str | None:
        return self._keys.get(provider)

    def values(self) -> tuple[str, ...]:
        return tuple(key for key in self._keys.values() if key)

    def __repr__(self) -> str:
        return f"ProviderKeys({len(self._keys)} providers, values hidden)"


def where(entry: ProviderEntry) -> str:
    """The provider's address as shown in errors and logs: scheme, host and port only."""
    parts = urlsplit(entry.base_url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}"


class TlsContext:
    """One TLS context for every client of a backend, made on first use: building one loads
    the system's certificates, which costs more CPU than a short answer."""

    __slots__ = ("_context",)

    def __init__(self) -> None:
        self._context: ssl.SSLContext | None = None

    def get(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = httpx2.create_ssl_context(trust_env=False)
        return self._context


@asynccontextmanager
async def open_provider_client(
    entry: ProviderEntry, key: str | None, timeouts: RequestTimeouts, tls: TlsContext | None = None
) -> AsyncIterator[openai.AsyncOpenAI]:
    """An SDK client for ``entry`` whose connections close when the block ends.

    The SDK's own retries are off: retrying is the backend's (bounded, cancellation-aware)."""
    verify: ssl.SSLContext | bool = True
    if tls is not None and entry.base_url.startswith("https:"):
        verify = tls.get()
    http = httpx2.AsyncClient(
        trust_env=False,
        follow_redirects=False,
        max_redirects=0,
        timeout=timeouts.for_httpx(),
        transport=httpx2.AsyncHTTPTransport(trust_env=False, verify=verify),
    )
    async with http:
        client = openai.AsyncOpenAI(
            api_key=key or NO_KEY,
            base_url=entry.base_url,
            max_retries=0,
            timeout=timeouts.for_httpx(),
            http_client=http,
            default_headers={
                **_without_ambient_headers(),
                # Named here so that the SDK drops an Authorization from the environment.
                "Authorization": f"Bearer {key or NO_KEY}",
            },
        )
        # The SDK would add these from OPENAI_ORG_ID / OPENAI_PROJECT_ID: meant for
        # api.openai.com, not for whatever endpoint the user configured.
        client.organization = None
        client.project = None
        yield client


def _without_ambient_headers() -> dict[str, Any]:
    """Headers that cancel the SDK's ``OPENAI_CUSTOM_HEADERS``: meant for api.openai.com (it
    may hold an Authorization header), they must not go to whatever endpoint is configured."""
    text = os.environ.get(_AMBIENT_HEADERS)
    if not text:
        return {}
    names = (line.partition(":")[0].strip() for line in text.split("\n") if ":" in line)
    return {name: openai.omit for name in names if name and name.lower() != "authorization"}


def is_chat_model(model_id: str) -> bool:
    lowered = model_id.lower()
    return not any(word in lowered for word in _NOT_CHAT)


class ProviderCatalog:
    """The runtime's ``ModelCatalog`` for the configured providers: ``provider/model`` ids, the
    configured default first. A provider without a ``models`` list is asked ``GET /models``
    (bounded); a model that left the configuration is simply not listed, and the runtime
    refuses tasks locked to it."""

    def __init__(
        self,
        config: ProviderConfig,
        keys: ProviderKeys,
        *,
        timeouts: RequestTimeouts | None = None,
    ) -> None:
        self._config = config
        self._keys = keys
        self._timeouts = timeouts or RequestTimeouts(read=MODEL_DISCOVERY_BOUND_S)
        self._tls = TlsContext()

    def default_model(self, account: str) -> ModelInfo:
        return self._info(self._config.default_model)

    async def check_providers(self) -> Sequence[ProviderCheck]:
        """Each provider's start-up check (``GET /models``, bounded): see ``_probe``."""
        from maple_acp.backends.openai._probe import check_providers

        return await check_providers(self._config, self._keys)

    def pending_checks(self) -> Sequence[ProviderCheck]:
        from maple_acp.backends.openai._probe import pending_checks

        return pending_checks(self._config)

    async def list_models(self, account: str) -> Sequence[ModelInfo]:
        models: list[ModelInfo] = []
        for entry in self._config.providers:
            if entry.models is not None:
                names: Sequence[str] = entry.models
            else:
                names = await self._discover(entry)
            models.extend(self._info(f"{entry.name}/{name}") for name in names)
        return models

    async def _discover(self, entry: ProviderEntry) -> list[str]:
        names: list[str] = []
        with trio.move_on_after(MODEL_DISCOVERY_BOUND_S) as scope:
            try:
                async with open_provider_client(
                    entry, self._keys.key_for(entry.name), self._timeouts, self._tls
                ) as client:
                    async for model in client.models.list():
                        if isinstance(model.id, str) and model.id.strip():
                            names.append(model.id)
                        if len(names) >= MAX_DISCOVERED_MODELS:
                            break
            except Exception as exc:
                # The SDK's text may quote the key; say only what kind of failure it was.
                status = getattr(single_exception(exc), "status_code", None)
                logger.warning(
                    "could not list the models of provider %s at %s (%s%s)",
                    entry.name,
                    where(entry),
                    type(single_exception(exc)).__name__,
                    f", HTTP {status}" if status else "",
                )
                return []
        if scope.cancelled_caught:
            logger.warning("listing the models of provider %s timed out", entry.name)
        return names

    def _info(self, model_id: str) -> ModelInfo:
        provider, _, model = model_id.partition("/")
        return ModelInfo(
            id=model_id,
            name=model,
            description=f"{model} at {provider}",
            chat=is_chat_model(model),
        )
