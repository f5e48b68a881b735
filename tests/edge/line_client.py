"""A raw JSON-RPC client on one end of a real socket pair, the service on the other: a client
that can stop reading for real, so the kernel's buffers are the real ones."""

from __future__ import annotations

import socket
from typing import Any

import orjson
import trio
from edge_harness import Harness


class LineClient:
    """Writes requests and reads whole lines; what a test reads on the way to an answer is
    its own (a subclass's ``answer``)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""
        self.next_id = 0

    async def send(self, method: str, params: Any) -> int:
        self.next_id += 1
        line = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        await self.stream.send_all(orjson.dumps(line) + b"\n")
        return self.next_id

    async def read(self) -> Any:
        while b"\n" not in self.buffer:
            data = await self.stream.receive_some(65536)
            assert data, "the service closed the connection"
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return orjson.loads(line)


def socket_pair_for(harness: Harness, nursery: trio.Nursery) -> trio.SocketStream:
    """The client's end of a socket pair whose other end ``harness``'s service serves."""
    ours, theirs = socket.socketpair()
    service_end = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
    nursery.start_soon(harness.acp.serve_stream, service_end)
    return trio.SocketStream(trio.socket.from_stdlib_socket(ours))
