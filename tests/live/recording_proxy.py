"""A recording reverse proxy on 127.0.0.1 between the host and a real inference server.

The host's provider points at the proxy; each request is forwarded to the server on a
connection of its own and the answer relayed back as it arrives. Every exchange is kept: the
request body exactly as the host sent it, the server's status and de-chunked body, each
``data:`` event with the moment it passed, and whether the host hung up before the server's
answer ended (the proxy then closes its own connection to the server at once, so the server
sees the disconnect as it would without the proxy).

``force_next`` adds fields to the next chat request only (the recorded body stays the host's):
how the tests ask the server for what the engine never sends, a forced ``tool_choice`` or a
small ``max_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import h11
import orjson
import trio

#: The most of one answer a test keeps (a streamed answer of a small model is far less).
MAX_KEPT_BYTES = 4 * 1024 * 1024


@attrs.define
class Exchange:
    """One request the host sent and what the server answered."""

    method: str
    path: str
    #: The request body as the host sent it.
    body: bytes
    #: ``trio.current_time()`` when the request had been read whole.
    arrived: float
    #: The fields ``force_next`` added to what reached the server.
    forced: dict[str, Any] = attrs.field(factory=dict)
    status: int | None = None
    #: The answer's body, de-chunked, as the server sent it.
    answer: bytearray = attrs.field(factory=bytearray)
    #: Each ``data:`` payload of a streamed answer, with the moment it passed the proxy.
    events: list[tuple[float, bytes]] = attrs.field(factory=list)
    #: The server ended its answer.
    ended: bool = False
    #: The host closed its connection before the answer ended.
    cut_by_client: bool = False
    #: When the proxy closed its connection to the server (an ended or cut exchange).
    closed_at: float | None = None
    _partial: bytes = b""

    @property
    def chat(self) -> bool:
        return self.method == "POST" and self.path.endswith("/chat/completions")

    def json(self) -> dict[str, Any]:
        value = orjson.loads(self.body)
        assert isinstance(value, dict)
        return value

    def payloads(self) -> list[Any]:
        """The parsed ``data:`` events, ``[DONE]`` left out."""
        return [orjson.loads(data) for _, data in self.events if data != b"[DONE]"]

    def content_times(self) -> list[float]:
        """When each event carrying answer text passed."""
        times = []
        for moment, data in self.events:
            if data == b"[DONE]":
                continue
            for choice in orjson.loads(data).get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    times.append(moment)
                    break
        return times

    def finish_reasons(self) -> list[str]:
        return [
            choice["finish_reason"]
            for payload in self.payloads()
            for choice in payload.get("choices") or ()
            if choice.get("finish_reason")
        ]

    def _take(self, data: bytes, now: float) -> None:
        if len(self.answer) + len(data) <= MAX_KEPT_BYTES:
            self.answer += data
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                self.events.append((now, line[5:].strip()))


class _Gone(Exception):
    """One side of an exchange went away mid-answer."""


class RecordingProxy:
    """See the module docstring. ``serve`` in a nursery; ``base_url`` is the ``/v1`` URL."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.exchanges: list[Exchange] = []
        self.port = 0
        self._forced: dict[str, Any] = {}
        self._changed = trio.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def force_next(self, **fields: Any) -> None:
        """Add ``fields`` to the body of the next chat request that reaches the server."""
        self._forced = dict(fields)

    def chats(self) -> list[Exchange]:
        return [exchange for exchange in self.exchanges if exchange.chat]

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds; re-checked on every change the proxy sees."""
        while not predicate():
            await self._changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        async with stream:
            connection = h11.Connection(h11.SERVER)
            while True:
                request = await _read_request(stream, connection)
                if request is None:
                    return
                head, body = request
                if not await self._exchange(stream, connection, head, body):
                    return
                if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                    return
                connection.start_next_cycle()

    async def _exchange(
        self, stream: trio.SocketStream, connection: h11.Connection, head: h11.Request, body: bytes
    ) -> bool:
        """Forward one request and relay its answer; false once the host has gone."""
        exchange = Exchange(
            method=head.method.decode(),
            path=head.target.decode(),
            body=body,
            arrived=trio.current_time(),
        )
        sent = body
        if exchange.chat and self._forced:
            exchange.forced, self._forced = self._forced, {}
            sent = orjson.dumps({**orjson.loads(body), **exchange.forced})
        self.exchanges.append(exchange)
        self._wake()
        headers = [
            (name, value)
            for name, value in head.headers
            if name not in (b"host", b"content-length", b"connection", b"accept-encoding")
        ]
        host, port = self.upstream
        headers += [
            (b"host", f"{host}:{port}".encode()),
            (b"content-length", str(len(sent)).encode()),
            (b"connection", b"close"),
            (b"accept-encoding", b"identity"),
        ]
        upstream_connection = h11.Connection(h11.CLIENT)
        try:
            async with await trio.open_tcp_stream(host, port) as upstream:
                await upstream.send_all(
                    upstream_connection.send(
                        h11.Request(method=head.method, target=head.target, headers=headers)
                    )
                    + upstream_connection.send(h11.Data(data=sent))
                    + upstream_connection.send(h11.EndOfMessage())
                )
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_client, stream, exchange, nursery.cancel_scope)
                    await self._relay(upstream, upstream_connection, stream, connection, exchange)
                    nursery.cancel_scope.cancel()
        except _Gone:
            # The host hung up, or the server broke off: the host's connection ends too.
            return False
        finally:
            exchange.closed_at = trio.current_time()
            self._wake()
        return not exchange.cut_by_client

    async def _watch_client(
        self, stream: trio.SocketStream, exchange: Exchange, relay: trio.CancelScope
    ) -> None:
        """The host sends nothing while it waits for an answer: the end of its stream is
        its hang-up."""
        try:
            data = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            exchange.cut_by_client = True
            relay.cancel()

    async def _relay(
        self,
        upstream: trio.SocketStream,
        upstream_connection: h11.Connection,
        stream: trio.SocketStream,
        connection: h11.Connection,
        exchange: Exchange,
    ) -> None:
        while True:
            try:
                event = upstream_connection.next_event()
            except h11.RemoteProtocolError:
                raise _Gone from None
            if event is h11.NEED_DATA:
                data = await upstream.receive_some(65536)
                upstream_connection.receive_data(data)
                continue
            if isinstance(event, h11.Response):
                exchange.status = event.status_code
                kept = [
                    (name, value)
                    for name, value in event.headers
                    if name not in (b"connection", b"transfer-encoding")
                ]
                await _send(
                    stream,
                    connection,
                    h11.Response(status_code=event.status_code, headers=kept, reason=event.reason),
                    exchange,
                )
            elif isinstance(event, h11.Data):
                exchange._take(bytes(event.data), trio.current_time())
                self._wake()
                await _send(stream, connection, h11.Data(data=event.data), exchange)
            elif isinstance(event, h11.EndOfMessage):
                exchange.ended = True
                await _send(stream, connection, h11.EndOfMessage(), exchange)
                return
            elif isinstance(event, h11.ConnectionClosed):
                # The server closed without ending its answer: so does the proxy.
                raise _Gone


async def _send(
    stream: trio.SocketStream, connection: h11.Connection, event: Any, exchange: Exchange
) -> None:
    try:
        await stream.send_all(connection.send(event) or b"")
    except trio.BrokenResourceError:
        exchange.cut_by_client = True
        raise _Gone from None


async def _read_request(
    stream: trio.SocketStream, connection: h11.Connection
) -> tuple[h11.Request, bytes] | None:
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                return None
            connection.receive_data(data)
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            return head, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            return None
