"""What a replay owes its client beyond the history: no live update of the session among the
replayed ones, then the dialect's end-of-replay marker before the answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from maple_acp.edge._client import ClientChannel


@asynccontextmanager
async def held_if(channel: ClientChannel, session_id: str, replay: bool) -> AsyncIterator[None]:
    """Hold the session's live updates (a background command's output, a goal's) for the
    block when ``replay``: they go out after the replay's last update, never among them."""
    if not replay:
        yield
        return
    async with channel.hold(session_id):
        yield
