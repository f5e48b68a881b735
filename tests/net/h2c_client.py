"""A small HTTP/2 client for the listener's h2c (prior knowledge), made of the ``h2`` package
over a Trio TCP stream, that decides its own flow control: a stream it *stalls* never has its
received data acknowledged, so the server sees that stream's window go to zero and stay there
(the connection's own window is made large, so only the stalled stream is held)."""

from __future__ import annotations

from collections.abc import Callable

import h2.config
import h2.connection
import h2.events
import trio

#: The connection-level window the client opens at once: never the one that stalls.
CONNECTION_WINDOW = 1 << 30


class H2cClient:
    """One h2c connection; :meth:`run` reads it (start it in a nursery), the rest asks."""

    def __init__(self, stream: trio.SocketStream, authority: str) -> None:
        self._stream = stream
        self._authority = authority.encode()
        self._h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self._lock = trio.Lock()
        #: Per stream: the response headers, the body received so far, whether it ended.
        self.headers: dict[int, dict[bytes, bytes]] = {}
        self.body: dict[int, bytearray] = {}
        self.ended: set[int] = set()
        #: Streams whose data is never acknowledged (their window only shrinks).
        self.stalled: set[int] = set()
        #: Bytes received but never acknowledged, per stalled stream.
        self.unacknowledged: dict[int, int] = {}
        self.closed = False
        self._changed = trio.Event()

    @classmethod
    async def connect(cls, address: str, port: int) -> H2cClient:
        client = cls(await trio.open_tcp_stream(address, port), f"{address}:{port}")
        client._h2.initiate_connection()
        client._h2.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        await client._flush()
        return client

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data:
            async with self._lock:
                await self._stream.send_all(data)

    async def request(
        self, method: str, headers: dict[str, str], body: bytes = b"", *, stall: bool = False
    ) -> int:
        """Send a request; its stream id. With ``stall`` its response data is never
        acknowledged."""
        stream_id = self._h2.get_next_available_stream_id()
        if stall:
            self.stalled.add(stream_id)
            self.unacknowledged[stream_id] = 0
        self.body[stream_id] = bytearray()
        self._h2.send_headers(
            stream_id,
            [
                (b":method", method.encode()),
                (b":path", b"/acp"),
                (b":scheme", b"http"),
                (b":authority", self._authority),
                *((k.lower().encode(), v.encode()) for k, v in headers.items()),
            ],
            end_stream=not body,
        )
        if body:
            self._h2.send_data(stream_id, body, end_stream=True)
        await self._flush()
        return stream_id

    async def unstall(self, stream_id: int) -> None:
        """Acknowledge what the stream received so far, and everything from now on."""
        self.stalled.discard(stream_id)
        owed = self.unacknowledged.pop(stream_id, 0)
        if owed:
            self._h2.acknowledge_received_data(owed, stream_id)
            await self._flush()

    async def run(self) -> None:
        """Read the connection until the server closes it."""
        try:
            while True:
                data = await self._stream.receive_some(65536)
                if not data:
                    return
                for event in self._h2.receive_data(data):
                    self._take(event)
                await self._flush()
                self._wake()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            self.closed = True
            self._wake()

    def _take(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            self.headers[event.stream_id] = dict(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            self.body.setdefault(event.stream_id, bytearray()).extend(event.data)
            if event.stream_id in self.stalled:
                self.unacknowledged[event.stream_id] += event.flow_controlled_length
            else:
                self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
            self.ended.add(event.stream_id)

    def _wake(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def until(self, done: Callable[[], bool]) -> None:
        """Until ``done()`` holds (checked after every read); ``AssertionError`` if the
        connection closes first."""
        while not done():
            if self.closed:
                raise AssertionError("the server closed the HTTP/2 connection")
            await self._changed.wait()

    async def answer(self, stream_id: int) -> tuple[int, dict[bytes, bytes], bytes]:
        """A whole response: status, headers, body."""
        await self.until(lambda: stream_id in self.ended)
        headers = self.headers[stream_id]
        return int(headers[b":status"]), headers, bytes(self.body[stream_id])
