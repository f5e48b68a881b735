"""A small Streamable HTTP MCP server on loopback for the soak run, as its own process.

It listens on an ephemeral 127.0.0.1 port and prints ``{"port": N}`` as one line on stdout once
it accepts connections. Tools: ``echo`` (the text back), ``add`` (two integers) and ``slow``
(sleeps until cancelled, at most a minute), enough for a session to list, call and cancel
calls through the host's transient router.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer


def build_server() -> MCPServer:
    server = MCPServer("soak")

    @server.tool(description="Echo the text back.")
    def echo(text: str) -> str:
        return text

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(description="Sleep until cancelled (at most a minute).")
    async def slow() -> str:
        await anyio.sleep(60)
        return "finished"

    return server


async def serve() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    app = build_server().streamable_http_app()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    # uvicorn exposes readiness only as a flag.
    while not server.started:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    sys.stdout.write(json.dumps({"port": sock.getsockname()[1]}) + "\n")
    sys.stdout.flush()
    await task


if __name__ == "__main__":
    asyncio.run(serve())
