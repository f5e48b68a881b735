"""The HTTP side: SDK clients over our own ``httpx2`` client (no ambient proxy or environment
settings, no redirects, explicit timeouts), one per provider for the backend's life
(:class:`ProviderClients`) and what an SDK or transport error means (:func:`sdk_fault`).

The SDK (``openai``, ``httpx2``) is imported only inside the functions that make a client or
read an error, never when this module is: a host imports it in a worker thread once it serves
(:meth:`ProviderClients.warm_up`), so neither its start nor its first prompt waits for it.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from maple_acp.backends.provider import (
    NO_KEY,
    ProviderEntry,
    ProviderFault,
    ProviderKeys,
    RequestTimeouts,
    TlsContext,
    http_client,
    without_ambient_headers,
)
from maple_acp.backends.provider import sdk_fault as provider_fault

if TYPE_CHECKING:
    import httpx2
    import openai


logger = logging.getLogger(__name__)

#: The SDK adds the headers listed in this environment variable to every request.
_AMBIENT_HEADERS = "OPENAI_CUSTOM_HEADERS"
#: Where the in-memory rehearsal request "goes" (its transport never opens a socket).
_REHEARSAL_URL = "http://rehearsal.invalid/v1"
#: The loggers a request through the SDK writes to (the SDK's client, the HTTP client).
_REQUEST_LOGGERS = ("openai._base_client", "httpx2")
#: Closing the clients at stop: shielded, but never for long.
CLIENT_CLOSE_BOUND_S = 2.0
#: What the first client and the first request would otherwise import on the event loop: the
#: SDK, its chat resource, the HTTP stack's Trio pieces, and the IDNA codec a host name is
#: encoded with. Each costs the loop tens of milliseconds; a worker thread pays instead.
SDK_MODULES = (
    "openai",
    "openai.resources.chat.chat",
    "openai.resources.chat.completions.completions",
    "httpx2",
    "httpcore2",
    "httpcore2._backends.trio",
    "h11",
    "anyio._backends._trio",
    "encodings.idna",
)


def import_sdk() -> None:
    """Import what the first request would (``SDK_MODULES``); run in a worker thread."""
    for name in SDK_MODULES:
        importlib.import_module(name)


def _prepare_sdk() -> None:
    import_sdk()
    rehearse_request()


class _ThisThreadQuiet(logging.Filter):
    """Drops the records one thread makes, so that a rehearsal is not logged as a request
    while the other threads' records (a real request at the same moment) still are."""

    def __init__(self) -> None:
        super().__init__()
        self._thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self._thread


def rehearse_request() -> None:
    """One streaming chat request through a throwaway synchronous SDK client whose transport
    answers in memory: the SDK's first-use work (its typed parameter tables, its platform
    headers) is done here, in the worker thread, instead of in a host's first prompt. Nothing
    leaves the process, and nothing of it is logged: it is no request to any server."""
    quiet = _ThisThreadQuiet()
    loggers = [logging.getLogger(name) for name in _REQUEST_LOGGERS]
    for each in loggers:
        each.addFilter(quiet)
    try:
        _rehearse()
    finally:
        for each in loggers:
            each.removeFilter(quiet)


def _rehearse() -> None:
    import httpx2
    import openai

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=b"data: [DONE]\n\n"
        )

    with httpx2.Client(transport=httpx2.MockTransport(answer), trust_env=False) as http:
        client = openai.OpenAI(
            api_key=NO_KEY, base_url=_REHEARSAL_URL, max_retries=0, http_client=http
        )
        create: Any = client.chat.completions.with_streaming_response.create
        with create(
            model="rehearsal",
            messages=(),
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"messages": [{"role": "user", "content": "-"}]},
        ) as raw:
            for _ in raw.iter_bytes():
                pass


def sdk_imported() -> bool:
    return all(name in sys.modules for name in SDK_MODULES)


def _sdk_client(
    entry: ProviderEntry, key: str | None, timeouts: RequestTimeouts, http: httpx2.AsyncClient
) -> openai.AsyncOpenAI:
    """The SDK's client for ``entry`` over ``http``. The SDK's own retries are off: retrying
    is the backend's (bounded, cancellation-aware)."""
    import openai

    client = openai.AsyncOpenAI(
        api_key=key or NO_KEY,
        base_url=entry.base_url,
        max_retries=0,
        timeout=timeouts.for_httpx(),
        http_client=http,
        default_headers={
            **without_ambient_headers(_AMBIENT_HEADERS, openai.omit),
            # Named here so that the SDK drops an Authorization from the environment.
            "Authorization": f"Bearer {key or NO_KEY}",
        },
    )
    # The SDK would add these from OPENAI_ORG_ID / OPENAI_PROJECT_ID: meant for
    # api.openai.com, not for whatever endpoint the user configured.
    client.organization = None
    client.project = None
    return client


@asynccontextmanager
async def open_provider_client(
    entry: ProviderEntry, key: str | None, timeouts: RequestTimeouts, tls: TlsContext | None = None
) -> AsyncIterator[openai.AsyncOpenAI]:
    """An SDK client for ``entry`` whose connections close when the block ends."""
    http = http_client(entry, timeouts, tls)
    async with http:
        yield _sdk_client(entry, key, timeouts, http)


class SdkLoader:
    """The SDK imported (and one request rehearsed in memory) once, in a worker thread, for
    everyone that needs it: the backend's clients, the start-up check, model discovery. The
    event loop never imports it itself, so a prompt is never stuck behind an import.

    Cancellation: the worker thread is abandoned by a cancel (the import finishes on its own);
    a caller waiting for another's import is woken when that one ends, however it ended."""

    def __init__(self) -> None:
        self._done: trio.Event | None = None

    async def ready(self) -> None:
        if self._done is None:
            if sdk_imported():
                return
            done = self._done = trio.Event()
            try:
                await trio.to_thread.run_sync(_prepare_sdk, abandon_on_cancel=True)
            finally:
                done.set()
        else:
            await self._done.wait()


class ProviderClients:
    """One SDK client per provider for as long as the owner (a backend) lives: its pooled
    keep-alive connections and its TLS context serve every turn, so no turn pays for making
    them.

    Resource handling: a client is made on first use, or ahead of it by :meth:`warm_up`;
    :meth:`aclose` closes every client and its connections, and no client is made after it.
    Each client belongs to the Trio run that made it.

    Error handling: a client asked for after :meth:`aclose` is a ``ProviderFault`` (the turn
    fails with one line).

    Cancellation: the SDK's import (``SdkLoader``) runs in a worker thread that a cancel
    abandons; :meth:`aclose` is shielded and bounded.
    """

    def __init__(
        self,
        keys: ProviderKeys,
        timeouts: RequestTimeouts,
        tls: TlsContext,
        sdk: SdkLoader | None = None,
    ) -> None:
        self._keys = keys
        self._timeouts = timeouts
        self._tls = tls
        self._sdk = sdk or SdkLoader()
        self._clients: dict[str, tuple[openai.AsyncOpenAI, httpx2.AsyncClient]] = {}
        self._closed = False

    async def warm_up(self, entries: Sequence[ProviderEntry]) -> None:
        """Import the SDK in a worker thread, then make each provider's client, so that the
        first turn finds everything ready. A turn that starts meanwhile waits for the same
        import instead of importing the modules from a second thread."""
        await self._sdk.ready()
        if any(entry.base_url.startswith("https:") for entry in entries):
            await trio.to_thread.run_sync(self._tls.get, abandon_on_cancel=True)
        for entry in entries:
            if not self._closed and entry.name not in self._clients:
                self._make(entry)

    async def get(self, entry: ProviderEntry) -> openai.AsyncOpenAI:
        made = self._clients.get(entry.name)
        if made is not None:
            return made[0]
        await self._sdk.ready()
        made = self._clients.get(entry.name)
        if made is not None:
            return made[0]
        return self._make(entry)

    def _make(self, entry: ProviderEntry) -> openai.AsyncOpenAI:
        if self._closed:
            raise ProviderFault("the host is stopping; the provider's client is closed")
        http = http_client(entry, self._timeouts, self._tls)
        client = _sdk_client(entry, self._keys.key_for(entry.name), self._timeouts, http)
        self._clients[entry.name] = (client, http)
        return client

    @property
    def open_clients(self) -> int:
        return len(self._clients)

    async def aclose(self) -> None:
        self._closed = True
        clients, self._clients = self._clients, {}
        with trio.CancelScope(shield=True), trio.move_on_after(CLIENT_CLOSE_BOUND_S):
            for _client, http in clients.values():
                await http.aclose()


def sdk_fault(exc: Exception, where: str, model: str) -> Exception:
    """What an SDK or transport error means (``provider.sdk_fault``)."""
    import openai

    return provider_fault(exc, where, model, openai)
