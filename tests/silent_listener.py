"""A loopback TCP listener that accepts connections and never answers: an MCP server named by
its URL keeps its client's setup waiting (up to the setup bound), for the tests of what that
wait may and may not hold."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


@asynccontextmanager
async def silent_listener() -> AsyncIterator[tuple[str, trio.Event]]:
    """Yields the MCP URL to name and an event set at the first accepted connection."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    held: list[trio.SocketStream] = []
    accepted = trio.Event()

    async def accept_forever() -> None:
        while True:
            held.append(await listeners[0].accept())
            accepted.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_forever)
        try:
            yield f"http://127.0.0.1:{port}/mcp", accepted
        finally:
            nursery.cancel_scope.cancel()
            for stream in held:
                await stream.aclose()
            await listeners[0].aclose()
