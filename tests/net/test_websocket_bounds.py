"""The WebSocket's bounds on a real socket, through hypercorn as the listener runs it:
permessage-deflate is never accepted (a frame compressed anyway is a protocol error that ends
only its own connection), a message is capped in bytes, and a peer that stops answering pings
is ended like a disconnect.

These tests also hold what ``maple_acp/net/_hypercorn_ws.py`` relies on in hypercorn: each one
fails if a hypercorn release builds or answers WebSockets another way."""

from __future__ import annotations

import base64
import logging
import os
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing
import wsproto.connection
import wsproto.events
from net_support import DEADLINE, NetHost, WsClient, net_host, rpc
from wsproto.connection import ConnectionState

from maple_acp.net import (
    AcpNetworkApp,
    GuardPolicy,
    NetworkLimits,
    NetworkSettings,
    RequestGuard,
    read_or_create_token,
    serve_network,
)
from maple_acp.rpc import EOF_GRACE_S, JsonRpcPeer

DEFLATE_OFFER = "permessage-deflate; client_max_window_bits"


def client_frame(
    payload: bytes, *, opcode: int = 0x1, compressed: bool = False, final: bool = True
) -> bytes:
    """One masked client frame (RSV1 set when ``compressed``)."""
    first = (0x80 if final else 0) | (0x40 if compressed else 0) | opcode
    size = len(payload)
    if size < 126:
        header = bytes([first, 0x80 | size])
    elif size < 1 << 16:
        header = bytes([first, 0x80 | 126]) + size.to_bytes(2, "big")
    else:
        header = bytes([first, 0x80 | 127]) + size.to_bytes(8, "big")
    mask = os.urandom(4)
    key = int.from_bytes((mask * (size // 4 + 1))[:size], "big")
    masked = (int.from_bytes(payload, "big") ^ key).to_bytes(size, "big")
    return header + mask + masked


class RawWebSocket:
    """A WebSocket client that writes its own handshake and frames, and reads the server's
    frames with wsproto (which knows no extension: a compressed server frame fails it)."""

    def __init__(self, stream: trio.SocketStream, headers: dict[str, str], rest: bytes) -> None:
        self.stream = stream
        self.headers = headers
        self.ws = wsproto.connection.Connection(wsproto.connection.ConnectionType.CLIENT)
        self.ws.receive_data(rest)

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, address: tuple[str, int], token: str, **extra: str
    ) -> AsyncIterator[RawWebSocket]:
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            key = base64.b64encode(os.urandom(16)).decode()
            lines = [
                "GET /acp HTTP/1.1",
                f"Host: {address[0]}:{address[1]}",
                "Upgrade: websocket",
                "Connection: Upgrade",
                f"Sec-WebSocket-Key: {key}",
                "Sec-WebSocket-Version: 13",
                f"Authorization: Bearer {token}",
                *(f"{name}: {value}" for name, value in extra.items()),
            ]
            await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
            answer = b""
            while b"\r\n\r\n" not in answer:
                data = await stream.receive_some(65536)
                assert data, "the server closed during the handshake"
                answer += data
            head, _, rest = answer.partition(b"\r\n\r\n")
            status, *fields = head.decode("latin-1").split("\r\n")
            assert status.split()[1] == "101", status
            headers = {}
            for field in fields:
                name, _, value = field.partition(":")
                headers[name.strip().lower()] = value.strip()
            yield cls(stream, headers, rest)

    async def events(self) -> list[Any]:
        """The next events the server's bytes make (``[]`` once the server closed TCP)."""
        while True:
            found = list(self.ws.events())
            if found:
                return found
            data = await self.stream.receive_some(65536)
            if not data:
                return []
            self.ws.receive_data(data)

    async def close_code(self) -> int | None:
        """Read until the server's close frame (its code) or the end of TCP (``None``)."""
        while True:
            found = await self.events()
            if not found:
                return None
            for event in found:
                if isinstance(event, wsproto.events.CloseConnection):
                    # wsproto reports a frame it could not read as a close too; a close frame
                    # from the server leaves it waiting for ours.
                    assert self.ws.state is ConnectionState.REMOTE_CLOSING, event
                    return int(event.code)


async def assert_usable(host: NetHost) -> None:
    async with WsClient.connect(host) as ws:
        await ws.send(rpc("initialize", {"protocolVersion": 1}, 0))
        assert (await ws.until(lambda m: m.get("id") == 0))["result"]


async def test_a_permessage_deflate_offer_is_not_accepted() -> None:
    async with net_host() as host:
        with trio.fail_after(DEADLINE):
            offers = {"Sec-WebSocket-Extensions": DEFLATE_OFFER}
            async with RawWebSocket.connect(host.address, host.token, **offers) as ws:
                assert "sec-websocket-extensions" not in ws.headers, ws.headers
                # The socket works, uncompressed.
                await ws.stream.send_all(client_frame(rpc("initialize", {"protocolVersion": 1}, 0)))
                found = await ws.events()
                message = next(e for e in found if isinstance(e, wsproto.events.TextMessage))
                assert orjson.loads(message.data)["id"] == 0


async def test_a_frame_compressed_anyway_ends_its_connection_with_a_protocol_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="maple_acp.net")
    # Sent as it would be had the extension been accepted: 8 MiB of JSON in about 8 KB.
    text = rpc("session/list", {"pad": " " * (8 << 20)}, 1)
    squeezer = zlib.compressobj(wbits=-15)
    bomb = (squeezer.compress(text) + squeezer.flush(zlib.Z_SYNC_FLUSH))[:-4]
    assert len(bomb) < 16 * 1024
    async with net_host() as host:
        with trio.fail_after(DEADLINE):
            async with WsClient.connect(host) as other:
                offers = {"Sec-WebSocket-Extensions": DEFLATE_OFFER}
                async with RawWebSocket.connect(host.address, host.token, **offers) as ws:
                    await ws.stream.send_all(client_frame(bomb, compressed=True))
                    assert await ws.close_code() == 1002
                    # Then the server closes the transport.
                    while await ws.events():
                        pass
                await other.send(rpc("initialize", {"protocolVersion": 1}, 0))
                assert (await other.until(lambda m: m.get("id") == 0))["result"]
            await assert_usable(host)
    # One calm line says why, without a traceback.
    said = [r for r in caplog.records if "out of protocol" in r.getMessage()]
    assert len(said) == 1
    assert said[0].levelno == logging.INFO
    assert said[0].exc_info is None


async def test_the_message_cap_counts_bytes_not_characters() -> None:
    cap = 64 * 1024
    async with net_host(max_message_bytes=cap) as host:
        with trio.fail_after(DEADLINE):
            async with WsClient.connect(host) as other, WsClient.connect(host) as ws:
                # Under the cap in bytes: answered.
                await ws.send(rpc("session/list", {"pad": "é" * (cap // 2 - 100)}, 1))
                assert (await ws.until(lambda m: m.get("id") == 1))["result"] == {"sessions": []}
                # 40,000 characters are 80,000 bytes: past the cap.
                await ws.send(rpc("session/list", {"pad": "é" * 40_000}, 2))
                assert await ws.receive() is None
                assert ws.closed_code == 1009
                await other.send(rpc("initialize", {"protocolVersion": 1}, 0))
                assert (await other.until(lambda m: m.get("id") == 0))["result"]
            await assert_usable(host)


async def test_a_fragmented_message_is_capped_on_its_whole_size() -> None:
    cap = 64 * 1024

    def fragments(text: bytes, size: int) -> bytes:
        parts = [text[i : i + size] for i in range(0, len(text), size)]
        frames = [
            client_frame(part, opcode=0x1 if n == 0 else 0x0, final=n == len(parts) - 1)
            for n, part in enumerate(parts)
        ]
        return b"".join(frames)

    async with net_host(max_message_bytes=cap) as host:
        with trio.fail_after(DEADLINE):
            async with RawWebSocket.connect(host.address, host.token) as ws:
                # Three fragments under the cap together (a character split between two of
                # them included): one message, answered.
                whole = rpc("session/list", {"pad": "é" * 20_000}, 1)
                await ws.stream.send_all(fragments(whole, 15_001))
                found = await ws.events()
                message = next(e for e in found if isinstance(e, wsproto.events.TextMessage))
                assert orjson.loads(message.data)["id"] == 1
                # Each fragment under the cap, together past it (in bytes, not in characters).
                past = rpc("session/list", {"pad": "é" * 40_000}, 2)
                await ws.stream.send_all(fragments(past, 30_000))
                assert await ws.close_code() == 1009
            await assert_usable(host)


class PeerHost:
    """A host whose connections are plain JSON-RPC peers answering every request ``{}``
    (``flood`` first sends ``count`` notifications of 60 KB each)."""

    def __init__(self) -> None:
        self.active = 0
        self.ended = 0
        self.released = trio.Event()

    def try_admit(self) -> bool:
        self.active += 1
        return True

    def release(self) -> None:
        self.active -= 1
        self.released.set()

    async def session_exists(self, session_id: str) -> bool:
        return False

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        peer: JsonRpcPeer

        async def on_request(method: str, params: Any) -> Any:
            if method == "flood":  # more than any socket buffer holds
                for n in range(params["count"]):
                    await peer.notify("flooded", {"n": n, "pad": "x" * 60_000})
            return {}

        peer = JsonRpcPeer(stream, on_request=on_request)
        try:
            await peer.serve()
        finally:
            self.ended += 1


@asynccontextmanager
async def listener(
    tmp_path: Path, **settings: Any
) -> AsyncIterator[tuple[PeerHost, tuple[str, int], str]]:
    """The listener as ``serve --http`` runs it (hypercorn, the ASGI app, the stream class)
    in front of plain JSON-RPC peers: no thread anywhere, so a mock clock can jump."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    host = PeerHost()
    network = NetworkSettings(host="127.0.0.1", port=0, data_dir=data, **settings)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_network, host, network)
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        yield host, ("127.0.0.1", port), read_or_create_token(data)
        nursery.cancel_scope.cancel()


async def test_a_peer_that_stops_answering_pings_is_ended_after_30_s(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    mock_clock.autojump_threshold = 0
    async with listener(tmp_path) as (host, address, token):
        with trio.fail_after(600):
            async with RawWebSocket.connect(address, token) as silent:
                opened = trio.current_time()
                pings: list[float] = []
                while True:
                    found = await silent.events()
                    if not found:
                        break  # the server closed the transport
                    for event in found:
                        assert isinstance(event, wsproto.events.Ping), event
                        pings.append(trio.current_time() - opened)
                ended = trio.current_time() - opened
            # A ping at 15 s and at 30 s; the first one unanswered for 30 s ends it at 45 s.
            assert pings == [15.0, 30.0]
            assert ended == 45.0
            # The connection ended like a disconnect: its slot came back.
            await host.released.wait()
            assert (host.active, host.ended) == (0, 1)


async def test_a_peer_that_stopped_reading_is_ended_although_our_writes_wait(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # The host's output fills every socket buffer between it and a peer that reads nothing
    # (as a vanished one does): the ping waits behind it, and so does any write; the deadline
    # must not.
    mock_clock.autojump_threshold = 0
    async with listener(tmp_path) as (host, address, token):
        with trio.fail_after(600):
            async with RawWebSocket.connect(address, token) as ws:
                opened = trio.current_time()
                await ws.stream.send_all(client_frame(rpc("flood", {"count": 500}, 1)))
                await host.released.wait()
                # Ended at 45 s; the peer then gave its running request its grace after EOF.
                assert trio.current_time() - opened == 45.0 + EOF_GRACE_S
                # The transport is closed: what was buffered for the peer ends in EOF.
                while await ws.stream.receive_some(1 << 20):
                    pass
            assert (host.active, host.ended) == (0, 1)


async def test_a_peer_that_answers_pings_stays(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    mock_clock.autojump_threshold = 0
    async with listener(tmp_path) as (host, address, token):
        with trio.fail_after(600):
            async with RawWebSocket.connect(address, token) as ws:
                opened = trio.current_time()
                answered = 0
                while trio.current_time() - opened < 300:
                    for event in await ws.events():
                        assert isinstance(event, wsproto.events.Ping), event
                        await ws.stream.send_all(client_frame(event.payload, opcode=0xA))
                        answered += 1
                assert answered == 20
                await ws.stream.send_all(client_frame(rpc("initialize", {}, 0)))
                found = await ws.events()
                message = next(e for e in found if isinstance(e, wsproto.events.TextMessage))
                assert orjson.loads(message.data) == {"jsonrpc": "2.0", "id": 0, "result": {}}
                assert host.ended == 0


async def test_a_peer_that_leaves_the_1009_close_unanswered_is_ended_after_5_s(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    mock_clock.autojump_threshold = 0
    async with listener(tmp_path, max_message_bytes=1024) as (host, address, token):
        with trio.fail_after(600):
            async with RawWebSocket.connect(address, token) as ws:
                sent = trio.current_time()
                await ws.stream.send_all(client_frame(b"x" * 2048))
                assert await ws.close_code() == 1009
                # What the peer sends after the close is read and dropped, never kept.
                await ws.stream.send_all(client_frame(b"y" * 100_000) * 8)
                assert await ws.events() == []
                assert trio.current_time() - sent == 5.0
            await host.released.wait()
            assert (host.active, host.ended) == (0, 1)


async def test_the_application_caps_a_message_in_bytes_whatever_its_server_counts() -> None:
    # Called as an ASGI server that counts characters would call it: 600 characters, 1,200
    # bytes, past a 1,024-byte cap.
    host = PeerHost()
    scope = {
        "type": "websocket",
        "path": "/acp",
        "headers": [(b"host", b"127.0.0.1:8765"), (b"authorization", b"Bearer secret")],
        "client": ("127.0.0.1", 40000),
        "subprotocols": [],
    }
    incoming = [
        {"type": "websocket.connect"},
        {"type": "websocket.receive", "text": rpc("poke", {"pad": "é" * 600}, 1).decode()},
    ]
    sent: list[Any] = []

    async def receive() -> Any:
        if incoming:
            return incoming.pop(0)
        await trio.sleep_forever()

    async def send(message: Any) -> None:
        sent.append(message)

    guard = RequestGuard(
        GuardPolicy.for_bind("127.0.0.1"), lambda offered: offered == "secret", trio.current_time
    )
    limits = NetworkLimits(keep_lines=256, keep_bytes=1 << 20, max_message_bytes=1024)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            app = AcpNetworkApp(host, guard, nursery, limits)
            await app(scope, receive, send)
            await host.released.wait()
    assert sent[0]["type"] == "websocket.accept"
    assert sent[-1] == {"type": "websocket.close", "code": 1009}
    assert (host.active, host.ended) == (0, 1)
