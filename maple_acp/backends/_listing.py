"""Asking a provider for its models in the shape of its own API, for the catalog and the
start-up check: ``GET /models`` with a Bearer key for an OpenAI-compatible provider, ``GET
/v1/models`` through the ``anthropic`` SDK (its key header and ``anthropic-version``) for an
Anthropic one. Each engine's SDK is made ready (imported in a worker thread, never on the event
loop) only when a provider of its kind is configured."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from maple_acp.backends.provider import (
    ANTHROPIC_KIND,
    OPENAI_KIND,
    ProviderEntry,
    RequestTimeouts,
    TlsContext,
)

if TYPE_CHECKING:
    from maple_acp.backends.openai import SdkLoader


async def ready_for(entries: Sequence[ProviderEntry], sdk: SdkLoader | None) -> None:
    """Import the SDK of every engine ``entries`` use, in worker threads (``sdk`` is the
    OpenAI-compatible engine's loader, shared with its backend: one import for both)."""
    kinds = {entry.kind for entry in entries}
    if OPENAI_KIND in kinds and sdk is not None:
        await sdk.ready()
    if ANTHROPIC_KIND in kinds:
        from maple_acp.backends.anthropic import import_sdk

        await trio.to_thread.run_sync(import_sdk, abandon_on_cancel=True)


@asynccontextmanager
async def open_model_lister(
    entry: ProviderEntry, key: str | None, timeouts: RequestTimeouts, tls: TlsContext | None = None
) -> AsyncIterator[Any]:
    """A client whose ``models.list()`` asks ``entry`` for its models (objects with an
    ``id``); its connections close when the block ends. Call :func:`ready_for` first."""
    if entry.kind == ANTHROPIC_KIND:
        from maple_acp.backends.anthropic import open_messages_client

        async with open_messages_client(entry, key, timeouts, tls) as client:
            yield client
    else:
        from maple_acp.backends.openai import open_provider_client

        async with open_provider_client(entry, key, timeouts, tls) as client:
            yield client
