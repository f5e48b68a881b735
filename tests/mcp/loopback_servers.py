"""Real MCP servers on loopback for the router tests, run as one subprocess.

Each variant listens on its own ephemeral 127.0.0.1 port; the ports are printed as one JSON line
on stdout once every socket is bound. Control endpoints under ``/_`` (outside MCP) let a test read
what a server saw: the HTTP requests with their headers, the slow tool's lifecycle events, and
ask the server to forget the session of one test (so its next request gets 404).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections import defaultdict
from typing import Any
from urllib.parse import parse_qs

import anyio
import uvicorn
from mcp import types
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer

#: The header a test sets so that it can find its own requests in the shared record.
TAG_HEADER = b"x-test-tag"

Scope = dict[str, Any]


class Recorder:
    """ASGI wrapper: records each request, answers the ``/_`` control endpoints, and replaces the
    session id of dropped tags with one the MCP server never issued."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.records: list[dict[str, Any]] = []
        self.dropped: set[str] = set()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        query = parse_qs(scope.get("query_string", b"").decode())
        if path == "/_records":
            tag = query.get("tag", [""])[0]
            await _json(send, [r for r in self.records if r["headers"].get("x-test-tag") == tag])
            return
        if path == "/_events":
            await _json(send, EVENTS.get(query.get("key", [""])[0], []))
            return
        if path == "/_drop":
            self.dropped.add(query.get("tag", [""])[0])
            await _json(send, "ok")
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        record: dict[str, Any] = {
            "method": scope["method"],
            "path": path,
            "query": scope.get("query_string", b"").decode(),
            "headers": headers,
        }
        if scope["method"] == "POST":
            body, receive = await _buffered(receive)
            record.update(_rpc_summary(body))
        self.records.append(record)
        if headers.get("x-test-tag") in self.dropped:
            rewritten = [
                (k, b"never-issued" if k.lower() == b"mcp-session-id" else v)
                for k, v in scope["headers"]
            ]
            scope = {**scope, "headers": rewritten}
        await self.app(scope, receive, send)


async def _buffered(receive: Any) -> tuple[bytes, Any]:
    """Read a whole request body; return it with a ``receive`` that replays it to the app."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Any:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


def _rpc_summary(body: bytes) -> dict[str, Any]:
    """The JSON-RPC method of a POST body, and for ``tools/call`` the tool and its arguments."""
    try:
        message = json.loads(body)
    except ValueError:
        return {"rpc": None}
    if not isinstance(message, dict):
        return {"rpc": None}
    summary: dict[str, Any] = {"rpc": message.get("method")}
    params = message.get("params")
    if message.get("method") == "tools/call" and isinstance(params, dict):
        summary["tool"] = params.get("name")
        summary["arguments"] = params.get("arguments")
    return summary


async def _json(send: Any, body: Any) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": data})


EVENTS: dict[str, list[str]] = defaultdict(list)


def main_server() -> MCPServer:
    server = MCPServer("main")

    @server.tool(description="Echo the text back.")
    def echo(text: str) -> str:
        return text

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(
        description="A tool dressed in annotations, icons and _meta.",
        annotations=types.ToolAnnotations(title="Decorated", read_only_hint=True),
        icons=[types.Icon(src="http://127.0.0.1/icon.png")],
        meta={"vendor": "decoration"},
    )
    def decorated() -> types.CallToolResult:
        return types.CallToolResult(
            content=[
                types.TextContent(
                    type="text",
                    text="plain",
                    annotations=types.Annotations(priority=1.0),
                    _meta={"vendor": "item"},
                ),
                types.EmbeddedResource(
                    type="resource",
                    resource=types.TextResourceContents(
                        uri="file:///x.txt", text="inside", _meta={"vendor": "resource"}
                    ),
                    annotations=types.Annotations(priority=0.5),
                ),
            ],
            _meta={"vendor": "result"},
        )

    @server.tool(description="Sleep until cancelled, recording what happens under `key`.")
    async def slow(key: str) -> str:
        EVENTS[key].append("started")
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            EVENTS[key].append("cancelled")
            raise
        return "finished"

    @server.tool(description="Return a text just over the result limit.", structured_output=False)
    def big() -> str:
        return "x" * (4 * 1024 * 1024 + 1024)

    @server.tool(
        description="Return a text over the transport's event limit.", structured_output=False
    )
    def huge() -> str:
        return "x" * (9 * 1024 * 1024)

    return server


def json_server() -> MCPServer:
    """Answers with plain JSON bodies instead of event streams."""
    server = MCPServer("json")

    @server.tool(description="Echo the text back.")
    def echo(text: str) -> str:
        return text

    @server.tool(description="Return a body over the response limit.", structured_output=False)
    def flood() -> str:
        return "x" * (17 * 1024 * 1024)

    return server


def _tool(name: str, *, description: str = "", schema: dict[str, Any] | None = None) -> types.Tool:
    return types.Tool(
        name=name,
        description=description,
        input_schema=schema or {"type": "object", "properties": {}},
    )


def catalog_server(variant: str) -> Server[Any]:
    """A low-level server whose ``tools/list`` misbehaves (or paginates) as ``variant`` says."""

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        cursor = params.cursor if params is not None else None
        page = int(cursor.rsplit("-", 1)[1]) if cursor else 0
        if variant == "many":
            return types.ListToolsResult(tools=[_tool(f"t{i}") for i in range(257)])
        if variant == "max":
            return types.ListToolsResult(tools=[_tool(f"t{i}") for i in range(256)])
        if variant == "badname":
            return types.ListToolsResult(tools=[_tool("ok"), _tool("has space")])
        if variant == "longname":
            return types.ListToolsResult(tools=[_tool("n" * 61)])
        if variant == "dupe":
            return types.ListToolsResult(tools=[_tool("same"), _tool("same")])
        if variant == "repeat":
            return types.ListToolsResult(tools=[_tool(f"p{page}")], next_cursor="page-1")
        if variant == "emptycursor":
            return types.ListToolsResult(tools=[_tool("a")], next_cursor="")
        if variant == "pages17":
            more = f"page-{page + 1}" if page < 16 else None
            return types.ListToolsResult(tools=[_tool(f"p{page}")], next_cursor=more)
        if variant == "paged":
            more = f"page-{page + 1}" if page < 2 else None
            return types.ListToolsResult(tools=[_tool(f"p{page}")], next_cursor=more)
        if variant == "bigtool":
            return types.ListToolsResult(tools=[_tool("big", description="d" * (300 * 1024))])
        if variant == "fat":
            return types.ListToolsResult(
                tools=[_tool(f"f{i}", description="d" * (200 * 1024)) for i in range(4)]
            )
        raise ValueError(variant)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=params.name)])

    return Server(f"catalog-{variant}", on_list_tools=list_tools, on_call_tool=call_tool)


class Redirector:
    """Answers 307 to a same-origin path; records whether anything reached that path."""

    def __init__(self) -> None:
        self.reached: list[str] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/_reached":
            await _json(send, self.reached)
            return
        if scope["path"].startswith("/target"):
            self.reached.append(scope["method"])
            await _json(send, {})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 307,
                "headers": [(b"location", b"/target/mcp"), (b"content-length", b"0")],
            }
        )
        await send({"type": "http.response.body", "body": b""})


CATALOG_VARIANTS = (
    "many",
    "max",
    "badname",
    "longname",
    "dupe",
    "repeat",
    "emptycursor",
    "pages17",
    "paged",
    "bigtool",
    "fat",
)


async def serve_all() -> None:
    apps: dict[str, Any] = {
        "main": Recorder(main_server().streamable_http_app()),
        "redirect": Redirector(),
        "json": json_server().streamable_http_app(json_response=True),
    }
    for variant in CATALOG_VARIANTS:
        apps[variant] = catalog_server(variant).streamable_http_app()
    sockets: dict[str, socket.socket] = {}
    for name in apps:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        sockets[name] = sock
    servers = [
        uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        for app in apps.values()
    ]
    tasks = [
        asyncio.create_task(server.serve(sockets=[sockets[name]]))
        for name, server in zip(apps, servers, strict=True)
    ]
    # uvicorn exposes readiness only as a flag.
    while not all(server.started for server in servers):  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    ports = {name: sock.getsockname()[1] for name, sock in sockets.items()}
    sys.stdout.write(json.dumps(ports) + "\n")
    sys.stdout.flush()
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(serve_all())
