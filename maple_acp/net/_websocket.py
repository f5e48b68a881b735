"""The WebSocket profile of the ACP network transport (GET ``/acp`` with ``Upgrade``).

Every upgrade passes :class:`~maple_acp.net._guard.RequestGuard` first (the token from
``Authorization`` or, for browsers, a subprotocol). An accepted socket is a new ACP
connection: each text message is one JSON-RPC message (or a v2 batch) each way; binary
messages are ignored. The upgrade answer carries ``Acp-Connection-Id``.

A message is capped in bytes (``NetworkLimits.max_message_bytes``; past it the socket closes
with 1009). The server under this profile (:mod:`maple_acp.net._hypercorn_ws`) applies the
same cap before it keeps a message, refuses permessage-deflate and pings the peer.
"""

from __future__ import annotations

import logging
from typing import Final

import trio

from maple_acp.net._asgi import (
    ACP_PATH,
    CONNECTION_HEADER,
    Receive,
    Scope,
    Send,
    address_of,
    headers_of,
    log_refusal,
)
from maple_acp.net._connections import ConnectionTable
from maple_acp.net._guard import (
    Refusal,
    RequestGuard,
    bearer_from_header,
    bearer_from_subprotocols,
    chosen_subprotocol,
)
from maple_acp.net._streams import Attachment, StreamEnded

logger = logging.getLogger(__name__)

#: The close code of a message past the cap (RFC 6455's "message too big").
MESSAGE_TOO_BIG: Final = 1009
#: The ASGI extension, and its event type, of text messages sent together in one write (our
#: server under this profile offers it: :mod:`maple_acp.net._hypercorn_ws`).
SEND_MANY: Final = "maple_acp.websocket.send_many"


class WebSocketProfile:
    """Serves one ASGI ``websocket`` scope, start to end."""

    def __init__(self, guard: RequestGuard, connections: ConnectionTable) -> None:
        self._guard = guard
        self._connections = connections

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        headers = headers_of(scope)
        offered = [str(p) for p in scope.get("subprotocols", ())]
        refusal = self._guard.check_host(headers.get("host")) or self._guard.check_origin(
            headers.get("origin")
        )
        if refusal is None:
            token = bearer_from_header(headers.get("authorization"))
            if token is None:
                token = bearer_from_subprotocols(offered)
            refusal = self._guard.check_token(address_of(scope), token)
        if refusal is None and scope.get("path") != ACP_PATH:
            refusal = Refusal(404, "a path other than /acp")
        if refusal is None and not self._connections.host.try_admit():
            logger.warning("refusing a network ACP connection: every connection slot is in use")
            refusal = Refusal(503, "every connection slot is in use")
        if refusal is not None:
            await self._refuse_upgrade(refusal, scope, send)
            return
        connection = self._connections.new("ws")
        await self._connections.start(connection)
        channel = connection.channel
        await send(
            {
                "type": "websocket.accept",
                "subprotocol": chosen_subprotocol(offered),
                "headers": [(CONNECTION_HEADER.encode(), connection.id.encode())],
            }
        )
        logger.info("network ACP connection opened (WebSocket)")
        attachment = channel.main.attach()
        limit = self._connections.limits.max_message_bytes
        too_big = False
        try:
            async with trio.open_nursery() as nursery:
                many = SEND_MANY in scope.get("extensions", {})
                nursery.start_soon(_send_websocket, attachment, send, nursery.cancel_scope, many)
                while True:
                    message = await receive()
                    if message["type"] != "websocket.receive":
                        break
                    text = message.get("text")
                    if text is None:
                        continue  # binary messages carry nothing in this protocol
                    data = text.encode()
                    # Our server refuses such a message before keeping it; an ASGI server
                    # that counts characters lets up to four times the cap by.
                    too_big = len(data) > limit
                    if too_big:
                        break
                    try:
                        await channel.deliver(data)
                    except trio.ClosedResourceError:
                        break
                nursery.cancel_scope.cancel()
            if too_big:
                # Once the writer has stopped: a message sent after the close is an error.
                logger.info("closing a WebSocket whose message passed %d bytes", limit)
                await send({"type": "websocket.close", "code": MESSAGE_TOO_BIG})
        finally:
            attachment.detach()
            channel.finish_input()

    async def _refuse_upgrade(self, refusal: Refusal, scope: Scope, send: Send) -> None:
        log_refusal(self._guard, refusal, scope, "WebSocket")
        if "websocket.http.response" in scope.get("extensions", {}):
            extra = [(b"www-authenticate", b"Bearer")] if refusal.status == 401 else []
            await send(
                {
                    "type": "websocket.http.response.start",
                    "status": refusal.status,
                    "headers": [*extra, (b"content-length", b"0")],
                }
            )
            await send({"type": "websocket.http.response.body", "body": b""})
        else:
            await send({"type": "websocket.close"})


async def _send_websocket(
    attachment: Attachment, send: Send, scope: trio.CancelScope, many: bool
) -> None:
    """The WebSocket's writer: one text message per JSON-RPC line, in order; a batch in one
    event when the server takes :data:`SEND_MANY`."""
    try:
        while True:
            try:
                batch = await attachment.next_batch(idle_after=float("inf"))
            except StreamEnded:
                break
            if batch is None:
                continue
            if many:
                await send({"type": SEND_MANY, "messages": [line for _, line in batch]})
            else:
                for _, line in batch:
                    await send({"type": "websocket.send", "text": line.decode()})
            attachment.written(batch)
        await send({"type": "websocket.close", "code": 1000})
    finally:
        scope.cancel()
