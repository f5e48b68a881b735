"""A session's MCP servers, those on loopback HTTP and those that live in the client.

The router is the same for both (``maple_acp.mcp``); what the edge adds is the way to a server
in the client: :class:`SessionMcpChannel` sends the router's ``mcp/message`` requests on the
connection that declared the servers, about the session being opened. The edge does not know
the transport under the connection (a Unix socket, the stdio connector, a WebSocket, Streamable
HTTP): the request goes out like a permission question, routed by its session.

Resource handling: the router (and its servers' MCP sessions) lives in the lease's nursery,
revoked with the lease; the channel holds no state of its own beyond the session id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from maple_acp.edge._client import ClientChannel
from maple_acp.mcp import ValidatedServer
from maple_acp.runtime import RouterFactory

if TYPE_CHECKING:
    from maple_acp.mcp import McpRouter


class SessionMcpChannel:
    """The client's end of one session's MCP-over-ACP servers (``mcp.McpMessageChannel``)."""

    def __init__(self, channel: ClientChannel, session_id: str) -> None:
        self._channel = channel
        self._session_id = session_id

    @property
    def session_id(self) -> str:
        return self._session_id

    async def request(self, params: Mapping[str, Any]) -> Any:
        return await self._channel.mcp_message(self._session_id, params)


def router_factory(
    servers: tuple[ValidatedServer, ...], channel: ClientChannel
) -> RouterFactory | None:
    """What the runtime runs inside a lease's nursery to connect its MCP servers; those in the
    client are reached through ``channel``, about the task the lease holds (its id is the
    session id the open's answer will carry)."""
    if not servers:
        return None

    async def start(nursery: trio.Nursery, task_id: str) -> McpRouter:
        # Imported here: the MCP SDK loads only when a session brings servers.
        from maple_acp.mcp import McpRouter

        router = McpRouter(servers, channel=SessionMcpChannel(channel, task_id))
        await nursery.start(router.serve)
        return router

    return start
