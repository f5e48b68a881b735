"""An in-process host with the network listener on a loopback port, and small clients for it:
raw Streamable HTTP requests (``httpx2``), a reader of SSE events, and a WebSocket handshake
made with ``wsproto`` over a Trio TCP stream."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx2
import orjson
import trio
import wsproto
import wsproto.events
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from maple_acp.cli import HostOptions, open_default_host
from maple_acp.net import NetworkSettings, read_or_create_token

#: Bounds a hang; every step here takes milliseconds.
DEADLINE = 20.0


@attrs.define
class NetHost:
    url: str
    token: str
    lifecycle: Any
    data_dir: Path
    socket: Path

    @property
    def address(self) -> tuple[str, int]:
        netloc = self.url.split("//", 1)[1].split("/", 1)[0]
        host, port = netloc.rsplit(":", 1)
        return host, int(port)

    def headers(self, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **extra}

    def client(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(trust_env=False, timeout=DEADLINE, follow_redirects=False)


@asynccontextmanager
async def net_host(project: Path | None = None, **settings: Any) -> AsyncIterator[NetHost]:
    """``maple-acp serve``'s host in this process (demo engine), listening on a private Unix
    socket and on ``127.0.0.1`` at a free port; ``settings`` go to ``NetworkSettings``."""
    directory = Path(tempfile.mkdtemp(prefix="macp-net-"))
    try:
        data = directory / "data"
        data.mkdir(mode=0o700)
        socket = directory / "acp.sock"
        max_connections = settings.pop("max_connections", 8)
        network = NetworkSettings(host="127.0.0.1", port=0, data_dir=data, **settings)
        options = HostOptions(
            endpoint=socket,
            data_dir=data,
            network=network,
            max_connections=max_connections,
        )
        async with open_default_host(options) as lifecycle:
            status = lifecycle.acp.host_status()
            url = status.engine["http"]
            yield NetHost(url, read_or_create_token(data), lifecycle, data, socket)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def sse_events(buffer: bytearray) -> list[tuple[int | None, Any]]:
    """Take the complete SSE events out of ``buffer``: ``(id, JSON data)`` pairs (comments
    skipped)."""
    events: list[tuple[int | None, Any]] = []
    while b"\n\n" in buffer:
        raw, _, rest = bytes(buffer).partition(b"\n\n")
        del buffer[: len(raw) + 2]
        event_id: int | None = None
        data: list[bytes] = []
        for line in raw.split(b"\n"):
            if line.startswith(b"id: "):
                event_id = int(line[4:])
            elif line.startswith(b"data: "):
                data.append(line[6:])
        if data:
            events.append((event_id, orjson.loads(b"\n".join(data))))
        del rest
    return events


class SseReader:
    """One open SSE response, read event by event."""

    def __init__(self, response: httpx2.Response) -> None:
        self.response = response
        self._chunks = response.aiter_bytes()
        self._buffer = bytearray()
        self._ready: list[tuple[int | None, Any]] = []

    async def next(self) -> tuple[int | None, Any]:
        while not self._ready:
            chunk = await self._chunks.__anext__()
            self._buffer.extend(chunk)
            self._ready.extend(sse_events(self._buffer))
        return self._ready.pop(0)

    async def until(
        self, done: Callable[[Any], bool], seen: list[tuple[int | None, Any]] | None = None
    ) -> tuple[int | None, Any]:
        while True:
            event = await self.next()
            if seen is not None:
                seen.append(event)
            if done(event[1]):
                return event


def rpc(method: str, params: Any, msg_id: int | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if msg_id is not None:
        message["id"] = msg_id
    return orjson.dumps(message)


INITIALIZE = rpc("initialize", {"protocolVersion": 1, "clientCapabilities": {}}, 0)


@attrs.define
class Upgrade:
    """What a WebSocket handshake ended in: accepted (with the chosen subprotocol and the
    connection id) or rejected (with the status)."""

    accepted: bool
    status: int
    subprotocol: str | None = None
    headers: dict[str, str] = attrs.field(factory=dict)


async def websocket_handshake(
    host: NetHost,
    *,
    headers: dict[str, str] | None = None,
    subprotocols: list[str] | None = None,
    host_header: str | None = None,
) -> Upgrade:
    """Open a TCP connection and try the WebSocket upgrade at ``/acp``; then close."""
    address, port = host.address
    stream = await trio.open_tcp_stream(address, port)
    async with stream:
        ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        request = wsproto.events.Request(
            host=host_header or f"{address}:{port}",
            target="/acp",
            extra_headers=[(k.encode(), v.encode()) for k, v in (headers or {}).items()],
            subprotocols=subprotocols or [],
        )
        await stream.send_all(ws.send(request))
        with trio.fail_after(DEADLINE):
            while True:
                data = await stream.receive_some(65536)
                ws.receive_data(data or None)
                for event in ws.events():
                    if isinstance(event, wsproto.events.AcceptConnection):
                        found = {k.decode().lower(): v.decode() for k, v in event.extra_headers}
                        return Upgrade(True, 101, event.subprotocol, found)
                    if isinstance(event, wsproto.events.RejectConnection):
                        return Upgrade(False, event.status_code)
                if not data:
                    raise AssertionError("the server closed before answering the upgrade")


class WsClient:
    """A WebSocket client made of wsproto over a Trio TCP stream: text messages each way."""

    def __init__(self, stream: trio.SocketStream, ws: wsproto.WSConnection) -> None:
        self.stream = stream
        self.ws = ws
        self._messages: list[str] = []
        self._partial = ""
        self.closed_code: int | None = None

    @classmethod
    @asynccontextmanager
    async def connect(cls, host: NetHost) -> AsyncIterator[WsClient]:
        address, port = host.address
        stream = await trio.open_tcp_stream(address, port)
        async with stream:
            ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
            headers = [(k.encode(), v.encode()) for k, v in host.headers().items()]
            await stream.send_all(
                ws.send(
                    wsproto.events.Request(
                        host=f"{address}:{port}", target="/acp", extra_headers=headers
                    )
                )
            )
            client = cls(stream, ws)
            with trio.fail_after(DEADLINE):
                while True:
                    data = await stream.receive_some(65536)
                    assert data, "closed during the handshake"
                    ws.receive_data(data)
                    events = list(ws.events())
                    if any(isinstance(e, wsproto.events.AcceptConnection) for e in events):
                        client._take(events)
                        break
                    assert not events, events
            yield client

    def _take(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, wsproto.events.TextMessage):
                self._partial += event.data
                if event.message_finished:
                    self._messages.append(self._partial)
                    self._partial = ""
            elif isinstance(event, wsproto.events.CloseConnection):
                self.closed_code = event.code

    async def send(self, text: str | bytes) -> None:
        data = text.decode() if isinstance(text, bytes) else text
        await self.stream.send_all(self.ws.send(wsproto.events.Message(data=data)))

    async def receive(self) -> Any:
        """The next message, parsed (``None`` once the server closed the WebSocket)."""
        while not self._messages:
            if self.closed_code is not None:
                return None
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.ws.receive_data(data)
            self._take(list(self.ws.events()))
        return orjson.loads(self._messages.pop(0))

    async def until(self, done: Callable[[Any], bool]) -> Any:
        while True:
            message = await self.receive()
            if message is None:
                raise AssertionError("the WebSocket closed first")
            if done(message):
                return message


def token_free(text: str, token: str) -> bool:
    return token not in text and token[: len(token) // 2] not in text


__all__ = [
    "DEADLINE",
    "INITIALIZE",
    "NetHost",
    "SseReader",
    "Upgrade",
    "WsClient",
    "net_host",
    "rpc",
    "sse_events",
    "token_free",
    "websocket_handshake",
]


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (0600)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path
