"""The network listener's TCP side (``maple_acp.net._tcp``), over real loopback sockets:
5 s from accept to a complete first request (on a mock clock), a connection whose client left
releases its descriptor at once, at most 64 connections (the 65th closed at accept, the owner's
admitted connection unharmed), and ``accept`` failing for want of descriptors told once a
minute with a count, for the TCP listener and the Unix socket alike.

The listener runs hypercorn's own connection class under a small subclass: the first test
fails when hypercorn changes what that subclass relies on."""

from __future__ import annotations

import inspect
import logging
import os
import resource
import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
import trio
import trio.testing
from hypercorn.events import Updated
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import TrioSingleTask
from net_support import INITIALIZE, WsClient, net_host, self_signed_certificate

from maple_acp.listeners import REPORT_WINDOW_S, RepeatReport, UnixListener
from maple_acp.net import NetworkSettings
from maple_acp.net._server import KEEP_ALIVE_S, _hypercorn_config
from maple_acp.net._tcp import (
    FIRST_REQUEST_S,
    MAX_TCP_CONNECTIONS,
    TcpAdmission,
    TcpWorker,
)

REQUEST = b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def answer_ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The smallest ASGI app: 200 and two bytes to every request."""
    if scope["type"] != "http":
        return
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


@asynccontextmanager
async def tcp_worker(
    app: Any = answer_ok, tls: tuple[Path, Path] | None = None, **options: Any
) -> AsyncIterator[tuple[TcpWorker, int]]:
    """A ``TcpWorker`` with the listener's real hypercorn settings on a free loopback port."""
    cert, key = tls or (None, None)
    settings = NetworkSettings(
        host="127.0.0.1", port=0, data_dir=Path("/nonexistent"), tls_cert=cert, tls_key=key
    )
    worker = TcpWorker(app, _hypercorn_config(settings), **options)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(worker.serve)
        yield worker, int(binds[0].rsplit(":", 1)[1])
        nursery.cancel_scope.cancel()


async def read_until_closed(stream: trio.abc.ReceiveStream) -> bytes:
    received = bytearray()
    try:
        while data := await stream.receive_some(65536):
            received.extend(data)
    except trio.BrokenResourceError:
        pass  # a TLS peer that closes without close_notify
    return bytes(received)


async def read_response(stream: trio.SocketStream) -> bytes:
    received = bytearray()
    while not received.endswith(b"ok"):
        data = await stream.receive_some(65536)
        assert data, "closed before the answer"
        received.extend(data)
    return bytes(received)


def test_hypercorn_still_has_what_the_connection_subclass_relies_on() -> None:
    """``_TcpConnection`` overrides ``run``, ``protocol_send`` and ``_read_data``, calls
    ``idle_task.stop()``, and reads a request's arrival from ``Updated(idle=False)``."""
    parameters = list(inspect.signature(TCPServer.__init__).parameters)
    assert parameters == ["self", "app", "config", "context", "state", "stream"]
    for name in ("run", "protocol_send", "_read_data", "_idle_timeout"):
        assert inspect.iscoroutinefunction(getattr(TCPServer, name)), name
    assert inspect.iscoroutinefunction(TrioSingleTask.stop)
    assert Updated(idle=False).idle is False
    # The idle task is made in __init__ (the subclass stops it once the client has gone).
    assert "self.idle_task = TrioSingleTask()" in inspect.getsource(TCPServer.__init__)
    # Reading ends and then reports the close, in _read_data (the subclass runs after it).
    assert "await self.protocol.handle(Closed())" in inspect.getsource(TCPServer._read_data)


def test_repeat_report_tells_the_first_then_once_a_window_with_a_count() -> None:
    now = [0.0]
    report = RepeatReport(lambda: now[0])
    told = []
    for step in range(1500):  # 150 s of a failure every 0.1 s
        now[0] = step / 10
        if count := report.note():
            told.append((now[0], count))
    assert told == [(0.0, 1), (60.0, 600), (120.0, 600)]


def test_admission_caps_connections_and_keeps_descriptors_in_reserve() -> None:
    admission = TcpAdmission(2, fd_limit=100, reserve=32)
    assert admission.try_admit(10) is None
    assert admission.try_admit(11) is None
    assert admission.try_admit(12) == "2 of 2 connections open"
    admission.release()
    assert admission.try_admit(68) == "the process is near its open-file limit"
    assert admission.try_admit(67) is None


async def test_a_silent_connection_is_closed_five_seconds_after_accept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with tcp_worker() as (worker, port):
        started = trio.current_time()
        silent = await trio.open_tcp_stream("127.0.0.1", port)
        # Half a request line: headers never completed count as no request.
        slow = await trio.open_tcp_stream("127.0.0.1", port)
        await slow.send_all(b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert await read_until_closed(silent) == b""
        assert await read_until_closed(slow) == b""
        assert trio.current_time() - started == pytest.approx(FIRST_REQUEST_S, abs=0.01)
        await trio.testing.wait_all_tasks_blocked()
        assert worker.admission.active == 0


async def test_over_tls_the_handshake_counts_within_the_five_seconds(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    cert, key = self_signed_certificate(tmp_path)
    client_context = ssl.create_default_context(cafile=str(cert))
    async with tcp_worker(tls=(cert, key)) as (worker, port):
        started = trio.current_time()
        silent = await trio.open_tcp_stream("127.0.0.1", port)
        tls = trio.SSLStream(
            await trio.open_tcp_stream("127.0.0.1", port),
            client_context,
            server_hostname="127.0.0.1",
        )
        await trio.sleep(FIRST_REQUEST_S / 2)
        await tls.do_handshake()
        # Handshaken, then silent: closed five seconds after accept, not after the handshake.
        assert await read_until_closed(tls) == b""
        assert trio.current_time() - started == pytest.approx(FIRST_REQUEST_S, abs=0.01)
        assert await read_until_closed(silent) == b""
        await trio.testing.wait_all_tasks_blocked()
        assert worker.admission.active == 0


async def test_a_request_in_time_lifts_the_deadline_and_keep_alive_is_longer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with tcp_worker() as (_, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await trio.sleep(FIRST_REQUEST_S - 0.1)
        await stream.send_all(REQUEST)
        assert (await read_response(stream)).startswith(b"HTTP/1.1 200")
        # Idle past the first-request deadline but within the keep-alive: still usable.
        await trio.sleep(KEEP_ALIVE_S - 1)
        await stream.send_all(REQUEST)
        assert (await read_response(stream)).startswith(b"HTTP/1.1 200")
        await stream.aclose()


async def test_an_http2_request_in_time_lifts_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with tcp_worker() as (_, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        h2c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        h2c.initiate_connection()
        await trio.sleep(FIRST_REQUEST_S - 0.1)
        headers = [(":method", "GET"), (":path", "/acp"), (":scheme", "http"),
                   (":authority", "127.0.0.1")]  # fmt: skip
        h2c.send_headers(1, headers, end_stream=True)
        await stream.send_all(h2c.data_to_send())
        ended = False
        while not ended:
            data = await stream.receive_some(65536)
            assert data, "closed before the answer"
            ended = any(isinstance(e, h2.events.StreamEnded) for e in h2c.receive_data(data))
            await stream.send_all(h2c.data_to_send())
        await trio.sleep(2 * FIRST_REQUEST_S)
        h2c.send_headers(3, headers, end_stream=True)
        await stream.send_all(h2c.data_to_send())
        events = h2c.receive_data(await stream.receive_some(65536))
        assert any(isinstance(e, h2.events.ResponseReceived) for e in events)
        await stream.aclose()


async def test_a_connection_whose_client_left_releases_its_descriptor_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with tcp_worker() as (worker, port):
        for payload in (b"", REQUEST):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            if payload:
                await stream.send_all(payload)
                await read_response(stream)
            await trio.testing.wait_all_tasks_blocked()
            assert worker.admission.active == 1
            left = trio.current_time()
            await stream.aclose()
            await trio.testing.wait_all_tasks_blocked()
            # Gone before any timer: not held for the keep-alive (30 s) or the deadline.
            assert worker.admission.active == 0
            assert trio.current_time() == left


async def test_the_65th_connection_is_closed_at_accept_and_the_owner_keeps_working(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="maple_acp.net")
    async with net_host() as host, WsClient.connect(host) as owner:
        await owner.send(INITIALIZE.decode())
        assert (await owner.until(lambda m: m.get("id") == 0))["result"]
        address, port = host.address
        others = [await trio.open_tcp_stream(address, port) for _ in range(MAX_TCP_CONNECTIONS - 1)]
        await trio.testing.wait_all_tasks_blocked()
        refused = [await trio.open_tcp_stream(address, port) for _ in range(3)]
        for stream in refused:
            assert await read_until_closed(stream) == b""
        # The owner's connection, admitted before, is served as ever.
        await owner.send('{"jsonrpc":"2.0","id":1,"method":"session/list","params":{}}')
        assert (await owner.until(lambda m: m.get("id") == 1))["result"] == {"sessions": []}
        for stream in (*others, *refused):
            await stream.aclose()
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert lines == [
        "refused 1 TCP connection in the last minute at accept: 64 of 64 connections open"
    ]


@contextmanager
def descriptors_exhausted() -> Iterator[None]:
    """Every descriptor number this process may use is taken until the block ends: the soft
    limit is lowered to just above the highest one in use, and the holes below are filled."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(name) for name in os.listdir("/proc/self/fd"))
    fillers: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
    try:
        while True:
            try:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        yield
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_accept_out_of_descriptors_is_told_once_a_minute_on_both_listeners(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "acp.sock"

    class Answering:
        """A host that answers each connection with one word."""

        def try_admit(self) -> bool:
            return True

        def release(self) -> None:
            pass

        async def serve_stream(self, stream: trio.abc.Stream) -> None:
            await stream.send_all(b"served")

        async def session_exists(self, session_id: str) -> bool:
            return False

    async with tcp_worker() as (_, port), trio.open_nursery() as nursery:
        await nursery.start(UnixListener(path).serve, Answering())
        # The clients' sockets exist before the descriptors run out; connecting needs none.
        tcp_client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        unix_client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with descriptors_exhausted():
            tcp_client.connect(("127.0.0.1", port))
            unix_client.connect(os.fspath(path))
            await trio.sleep(2.5 * REPORT_WINDOW_S)
        # Descriptors are back: both waiting connections are served.
        unix = trio.SocketStream(trio.socket.from_stdlib_socket(unix_client))
        assert await unix.receive_some(16) == b"served"
        tcp = trio.SocketStream(trio.socket.from_stdlib_socket(tcp_client))
        await tcp.send_all(REQUEST)
        assert (await read_response(tcp)).startswith(b"HTTP/1.1 200")
        await unix.aclose()
        await tcp.aclose()
        nursery.cancel_scope.cancel()
    failures = [r for r in caplog.records if "accept failed" in r.getMessage()]
    # Each listener: once at the start, then once a minute, each with its count.
    assert len(failures) == 6
    for record in failures:
        assert "EMFILE" in record.getMessage()
        assert record.exc_info is None
    counts = [int(r.getMessage().split(") ", 1)[1].split(" ", 1)[0]) for r in failures]
    assert sorted(counts)[:2] == [1, 1]
    # The rest tell a minute of tries every 0.1 s each.
    assert all(590 <= count <= 610 for count in sorted(counts)[2:])
    assert not [r for r in caplog.records if r.name == "trio.serve_listeners"]


async def test_connect_and_close_through_the_host_leaves_no_descriptor_behind() -> None:
    """Hypercorn on its own held each closed connection's descriptor for the keep-alive."""
    async with net_host() as host:
        address, port = host.address
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(100):
            stream = await trio.open_tcp_stream(address, port)
            await stream.aclose()
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert len(os.listdir("/proc/self/fd")) <= before + 2
