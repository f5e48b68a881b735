"""The ASGI application at ``/acp``: it hands each scope to its profile of the ACP network
transport (``websocket`` to :class:`~maple_acp.net._websocket.WebSocketProfile`, ``http`` to
:class:`~maple_acp.net._http.StreamableHttpProfile`) and answers the server's lifespan. Both
profiles share one :class:`~maple_acp.net._connections.ConnectionTable`.
"""

from __future__ import annotations

import trio

from maple_acp.net._asgi import Receive, Scope, Send
from maple_acp.net._connections import (
    ConnectionTable,
    NetworkConnection,
    NetworkHost,
    NetworkLimits,
    TokenWatch,
)
from maple_acp.net._guard import RequestGuard
from maple_acp.net._http import StreamableHttpProfile
from maple_acp.net._websocket import WebSocketProfile


class AcpNetworkApp:
    """See the module docstring. ``nursery`` is the listener's: connections run in it.
    ``token`` is followed so that a rotation ends the connections of the old token."""

    def __init__(
        self,
        host: NetworkHost,
        guard: RequestGuard,
        nursery: trio.Nursery,
        limits: NetworkLimits,
        token: TokenWatch | None = None,
    ) -> None:
        table = ConnectionTable(host, nursery, limits, token)
        #: The live connections by id.
        self.connections: dict[str, NetworkConnection] = table.by_id
        self._http = StreamableHttpProfile(guard, table)
        self._websocket = WebSocketProfile(guard, table)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    @staticmethod
    async def _lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
