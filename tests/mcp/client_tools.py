"""MCP servers that live in a test client: its answers to the host's ``mcp/message`` requests.

Two kinds: :class:`ScriptedTools` answers with hand-built MCP JSON (what a browser page does
in a few lines), and :class:`SdkTools` forwards each inner message to the MCP SDK's low-level
``Server`` running in-process over memory streams (a real MCP server behind the client).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import trio
from mcp import types
from mcp.server.lowlevel import Server
from mcp.shared.message import SessionMessage

from maple_acp.testing.client import AcpTestClient

#: The stateless MCP revision and where a request names it.
STATELESS_VERSION = "2026-07-28"
STATELESS_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
STATELESS_RESULT = {"resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
#: A result just over the 4 MiB limit on what a tool call returns.
BIG_TEXT_CHARS = 4 * 1024 * 1024 + 1024

TOOLS: list[dict[str, Any]] = [
    {
        "name": "add",
        "description": "Adds two numbers",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
    {
        "name": "echo",
        "description": "Says its text back",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
    {"name": "hang", "description": "Never answers", "inputSchema": {"type": "object"}},
    {"name": "big", "description": "Answers too much", "inputSchema": {"type": "object"}},
    {"name": "broken", "description": "Fails inside", "inputSchema": {"type": "object"}},
]


class ScriptedTools:
    """The client's MCP servers, answered by hand: ``initialize``, ``tools/list`` and the tools
    above. Every ``mcp/message`` it gets is kept in :attr:`seen`; with ``silent`` it never
    answers any."""

    def __init__(self, *, silent: bool = False, stateless: bool = False) -> None:
        self.seen: list[dict[str, Any]] = []
        self.silent = silent
        #: Speak only the stateless MCP revision, as the ACP SDKs' providers do: no
        #: ``initialize``, ``server/discover`` instead, the version in every request's ``_meta``.
        self.stateless = stateless
        #: Inner requests still waiting for their answer when they were abandoned.
        self.abandoned = 0

    def attach(self, client: AcpTestClient) -> None:
        client.request_handlers["mcp/message"] = self.handle

    def inner(self, method: str) -> list[dict[str, Any]]:
        return [seen for seen in self.seen if seen["method"] == method]

    async def handle(self, params: Any) -> Any:
        self.seen.append(params)
        try:
            if self.silent:
                await trio.sleep_forever()
            return await self._answer(params["method"], params.get("params") or {})
        except trio.Cancelled:
            self.abandoned += 1
            raise

    async def _answer(self, method: str, params: Mapping[str, Any]) -> Any:
        if self.stateless:
            version = (params.get("_meta") or {}).get(STATELESS_VERSION_KEY)
            if version != STATELESS_VERSION:
                return {"error": {"code": -32602, "message": f"missing {STATELESS_VERSION_KEY}"}}
            if method == "server/discover":
                found = {"supportedVersions": [STATELESS_VERSION], "capabilities": {"tools": {}}}
                return {"result": {**found, **STATELESS_RESULT}}
            answer = await self._legacy(method, params)
            if "result" in answer:
                # The revision's results say how long they may be cached and that they are whole.
                answer["result"] = {**answer["result"], **STATELESS_RESULT}
            return answer
        return await self._legacy(method, params)

    async def _legacy(self, method: str, params: Mapping[str, Any]) -> Any:
        if method == "initialize":
            return {
                "result": {
                    "protocolVersion": params["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "page-tools", "version": "1"},
                }
            }
        if method == "tools/list":
            return {"result": {"tools": TOOLS}}
        if method != "tools/call":
            return {"error": {"code": -32601, "message": f"no method {method}"}}
        name, arguments = params["name"], params.get("arguments") or {}
        if name == "add":
            total = arguments["a"] + arguments["b"]
            return {
                "result": {
                    "content": [{"type": "text", "text": str(total)}],
                    "structuredContent": {"result": total},
                }
            }
        if name == "echo":
            return {"result": {"content": [{"type": "text", "text": arguments.get("text", "")}]}}
        if name == "hang":
            await trio.sleep_forever()
        if name == "big":
            return {"result": {"content": [{"type": "text", "text": "x" * BIG_TEXT_CHARS}]}}
        return {"error": {"code": -32000, "message": "the page went away", "data": {"n": 1}}}


def sdk_server() -> Server[Any]:
    """A low-level MCP SDK server with one tool, ``shout``."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name="shout",
                    description="Says its text back in capitals",
                    input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
                )
            ]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        text = str((params.arguments or {}).get("text", ""))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text.upper())])

    return Server("sdk-tools", on_list_tools=list_tools, on_call_tool=call_tool)


class SdkTools:
    """A real MCP server behind the client: each ``mcp/message`` is handed to the SDK's server
    as the inner request and its response is the answer. The host never sends the inner
    ``notifications/initialized`` (ACP has no shape for it), so this client tells its server
    itself once it answered ``initialize``, as a client bridging to an MCP library does."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self._to_server: anyio.abc.ObjectSendStream[SessionMessage | Exception] | None = None
        self._waiting: dict[Any, trio.MemorySendChannel[Any]] = {}

    def attach(self, client: AcpTestClient) -> None:
        client.request_handlers["mcp/message"] = self.handle

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SdkTools]:
        to_server, server_read = anyio.create_memory_object_stream[SessionMessage | Exception](16)
        server_write, from_server = anyio.create_memory_object_stream[SessionMessage](16)
        server = sdk_server()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                server.run, server_read, server_write, server.create_initialization_options()
            )
            nursery.start_soon(self._read_answers, from_server)
            self._to_server = to_server
            yield self
            nursery.cancel_scope.cancel()

    async def _read_answers(self, from_server: anyio.abc.ObjectReceiveStream[Any]) -> None:
        async for item in from_server:
            message = item.message
            if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
                waiting = self._waiting.pop(str(message.id), None)
                if waiting is not None:
                    await waiting.send(message)

    async def handle(self, params: Any) -> Any:
        self.seen.append(params)
        assert self._to_server is not None
        request_id = params["requestId"]
        send, receive = trio.open_memory_channel[Any](1)
        self._waiting[request_id] = send
        request = types.JSONRPCRequest(
            jsonrpc="2.0", id=request_id, method=params["method"], params=params.get("params")
        )
        await self._to_server.send(SessionMessage(message=request))
        answer = await receive.receive()
        if params["method"] == "initialize":
            ready = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized")
            await self._to_server.send(SessionMessage(message=ready))
        if isinstance(answer, types.JSONRPCError):
            return {"error": answer.error.model_dump(mode="json", exclude_none=True)}
        return {"result": answer.result}


def acp_server(name: str = "page", server_id: str = "page-1") -> dict[str, Any]:
    """An ACP ``mcpServers`` entry for a server that lives in the client."""
    return {"type": "acp", "name": name, "serverId": server_id}
