"""The HTTP side of the Anthropic backend: one SDK client per provider over our own ``httpx2``
client (no ambient proxy, environment credentials or headers, no redirects, explicit timeouts).

Resource handling: the SDK cleans up a forgotten client only under asyncio; on Trio every
client is closed here, explicitly, by ``MessagesClients.aclose`` (shielded and bounded, so a
cancel cannot leave a connection open).

The SDK is imported by the functions that use it, never with this module: importing it costs a
host more than its whole start (``import_sdk`` does it in a worker thread ahead of a turn)."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

from maple_acp.backends.provider import (
    NO_KEY,
    ProviderEntry,
    ProviderKeys,
    RequestTimeouts,
    TlsContext,
    http_client,
    without_ambient_headers,
)
from maple_acp.backends.provider import sdk_fault as provider_fault

if TYPE_CHECKING:
    import anthropic

#: The SDK adds the headers listed in this environment variable to every request.
_AMBIENT_HEADERS = "ANTHROPIC_CUSTOM_HEADERS"
#: The configured base URL names the API root like an OpenAI-compatible one (``.../v1``,
#: which model discovery uses); the SDK adds this part itself.
_VERSION_SUFFIX = "/v1"
#: Closing a client after its turn: shielded, but never for long.
CLIENT_CLOSE_BOUND_S = 1.0


def sdk_base_url(base_url: str) -> str:
    """The SDK's base URL for a configured one: without the trailing ``/v1``."""
    if base_url.endswith(_VERSION_SUFFIX):
        return base_url[: -len(_VERSION_SUFFIX)]
    return base_url


class MessagesClients:
    """One SDK client per provider for the backend's life, made on first use (a client costs
    tens of milliseconds to make; a turn should not pay that).

    Resource handling: :meth:`aclose` closes every client and its connections, explicitly
    (shielded and bounded): under Trio nothing else would."""

    def __init__(self, keys: ProviderKeys, timeouts: RequestTimeouts) -> None:
        self._keys = keys
        self._timeouts = timeouts
        self._tls = TlsContext()
        self._clients: dict[str, anthropic.AsyncAnthropic] = {}
        self._closed = False

    def get(self, entry: ProviderEntry) -> anthropic.AsyncAnthropic:
        if self._closed:
            raise RuntimeError("the backend's clients are closed")
        client = self._clients.get(entry.name)
        if client is None:
            client = self._clients[entry.name] = make_messages_client(
                entry, self._keys.key_for(entry.name), self._timeouts, self._tls
            )
        return client

    async def aclose(self) -> None:
        self._closed = True
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            with trio.CancelScope(shield=True), trio.move_on_after(CLIENT_CLOSE_BOUND_S):
                await client.close()


def make_messages_client(
    entry: ProviderEntry, key: str | None, timeouts: RequestTimeouts, tls: TlsContext | None = None
) -> anthropic.AsyncAnthropic:
    """An SDK client for ``entry`` over its own HTTP client (closed with it).

    The key is passed explicitly, so the SDK consults no credential variable, profile or
    federation file; its own retries are off (retrying is the backend's, bounded and
    cancellation-aware)."""
    import anthropic

    return anthropic.AsyncAnthropic(
        api_key=key or NO_KEY,
        base_url=sdk_base_url(entry.base_url),
        max_retries=0,
        timeout=timeouts.for_httpx(),
        http_client=http_client(entry, timeouts, tls),
        default_headers={
            **without_ambient_headers(_AMBIENT_HEADERS, anthropic.omit),
            # Named here so that an Authorization from the environment cannot replace it.
            "Authorization": f"Bearer {key or NO_KEY}",
        },
        open_telemetry=False,
    )


@asynccontextmanager
async def open_messages_client(
    entry: ProviderEntry, key: str | None, timeouts: RequestTimeouts, tls: TlsContext | None = None
) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """An SDK client for ``entry`` for one short use (the start-up check, model discovery):
    its ``models.list()`` is ``GET /v1/models`` with the key as the SDK sends it and
    the ``anthropic-version`` header. Closed when the block ends (shielded and bounded)."""
    client = make_messages_client(entry, key, timeouts, tls)
    try:
        yield client
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(CLIENT_CLOSE_BOUND_S):
            await client.close()


#: What the first client and request would otherwise import on the event loop.
SDK_MODULES = ("anthropic", "anthropic.resources.messages", "httpx2", "anyio._backends._trio")


def import_sdk() -> None:
    """Import the SDK (blocking: call it in a worker thread)."""
    for module in SDK_MODULES:
        importlib.import_module(module)


def sdk_fault(exc: Exception, where: str, model: str) -> Exception:
    """What an SDK or transport error means (``provider.sdk_fault``)."""
    import anthropic

    return provider_fault(exc, where, model, anthropic)
