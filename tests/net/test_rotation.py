"""A token no longer in force leaves nobody talking under it: a rotation, a token file that
vanished and one that others can read end every connection admitted under the old token
within a second, WebSocket and SSE alike, like a disconnect (the slot comes back, the
sessions stay). Such a file admits nobody (``503``, one log line, never a ``500``).

First on a mock clock with the ASGI application called directly (a real token file, a real
JSON-RPC peer behind each connection), then on a real loopback listener."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from net_support import DEADLINE, INITIALIZE, SseReader, WsClient, net_host, rpc

from maple_acp.net import (
    AcpNetworkApp,
    GuardPolicy,
    NetworkLimits,
    RequestGuard,
    TokenFile,
    read_or_create_token,
    rotate_token,
    token_path,
)
from maple_acp.rpc import JsonRpcPeer

JSON = {"Content-Type": "application/json"}


class PeerHost:
    """A host whose connections are plain JSON-RPC peers answering every request ``{}``."""

    def __init__(self) -> None:
        self.active = 0
        self.ended = 0

    def try_admit(self) -> bool:
        self.active += 1
        return True

    def release(self) -> None:
        self.active -= 1

    async def session_exists(self, session_id: str) -> bool:
        return True

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        async def on_request(method: str, params: Any) -> Any:
            return {}

        try:
            await JsonRpcPeer(stream, on_request=on_request).serve()
        finally:
            self.ended += 1


class Call:
    """One ASGI scope (``http`` or ``websocket``): what the app sent, and when it ended."""

    def __init__(self, kind: str, token: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.scope: MutableMapping[str, Any] = {
            "type": kind,
            "method": "POST" if body else "GET",
            "path": "/acp",
            "headers": [
                (k.lower().encode(), v.encode())
                for k, v in {
                    "host": "127.0.0.1:8765",
                    "authorization": f"Bearer {token}",
                    **headers,
                }.items()
            ],
            "client": ("127.0.0.1", 40000),
        }
        self._first: MutableMapping[str, Any] | None = (
            {"type": "websocket.connect"}
            if kind == "websocket"
            else {"type": "http.request", "body": body, "more_body": False}
        )
        self.sent: list[MutableMapping[str, Any]] = []
        self.done = trio.Event()

    async def receive(self) -> MutableMapping[str, Any]:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(message)

    async def run(self, app: AcpNetworkApp) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        finally:
            self.done.set()

    def first(self, kind: str) -> MutableMapping[str, Any]:
        return next(m for m in self.sent if m["type"] == kind)

    @property
    def status(self) -> int:
        return int(self.first("http.response.start")["status"])


async def initialize(app: AcpNetworkApp, token: str) -> tuple[Call, str]:
    call = Call("http", token, {"content-type": "application/json"}, INITIALIZE)
    await call.run(app)
    if call.status != 200:
        return call, ""
    headers = dict(call.first("http.response.start")["headers"])
    return call, headers[b"acp-connection-id"].decode()


def make_app(nursery: trio.Nursery, host: PeerHost, data_dir: Path) -> AcpNetworkApp:
    read_or_create_token(data_dir)
    token = TokenFile(data_dir)
    guard = RequestGuard(GuardPolicy.for_bind("127.0.0.1"), token.matches, trio.current_time)
    limits = NetworkLimits(keep_lines=256, keep_bytes=1 << 22, max_message_bytes=1 << 20)
    return AcpNetworkApp(host, guard, nursery, limits, token)


def rotate(data_dir: Path) -> None:
    rotate_token(data_dir)


def make_readable(data_dir: Path) -> None:
    os.chmod(token_path(data_dir), 0o644)


def remove(data_dir: Path) -> None:
    token_path(data_dir).unlink()


@pytest.mark.parametrize("change", [rotate, make_readable, remove])
async def test_connections_of_a_token_no_longer_in_force_end_within_a_second(
    mock_clock: trio.testing.MockClock, tmp_path: Path, change: Callable[[Path], None]
) -> None:
    mock_clock.autojump_threshold = 0
    host = PeerHost()
    async with trio.open_nursery() as nursery:
        app = make_app(nursery, host, tmp_path)
        old = read_or_create_token(tmp_path)
        _, connection = await initialize(app, old)
        sse = Call("http", old, {"accept": "text/event-stream", "acp-connection-id": connection})
        nursery.start_soon(sse.run, app)
        ws = Call("websocket", old, {})
        nursery.start_soon(ws.run, app)
        # Both go on past many looks at an unchanged file.
        await trio.sleep(10)
        assert not sse.done.is_set()
        assert not ws.done.is_set()
        assert host.active == 2
        changed = trio.current_time()
        change(tmp_path)
        with trio.fail_after(5):
            await sse.done.wait()
            await ws.done.wait()
            while True:
                if not host.active:
                    break
                await trio.sleep(0.01)
        assert trio.current_time() - changed <= 1.0
        # Ended like a disconnect: the SSE response finished, the WebSocket closed, each
        # peer saw its input end and gave its slot back.
        assert sse.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
        assert ws.sent[-1]["type"] == "websocket.close"
        assert host.ended == 2
        assert connection not in app.connections
        if change is rotate:
            # The old connection is gone even for the new token: the client reconnects.
            new = read_or_create_token(tmp_path)
            post = Call(
                "http",
                new,
                {"content-type": "application/json", "acp-connection-id": connection},
                rpc("session/list", {}, 1),
            )
            await post.run(app)
            assert post.status == 404
            again, reconnected = await initialize(app, new)
            assert again.status == 200
            await trio.sleep(5)
            assert reconnected in app.connections
        else:
            refused, _ = await initialize(app, old)
            assert refused.status == 503
        nursery.cancel_scope.cancel()


async def test_a_touched_token_file_ends_nothing(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    mock_clock.autojump_threshold = 0
    host = PeerHost()
    async with trio.open_nursery() as nursery:
        app = make_app(nursery, host, tmp_path)
        token = read_or_create_token(tmp_path)
        ws = Call("websocket", token, {})
        nursery.start_soon(ws.run, app)
        await trio.sleep(1)
        os.utime(token_path(tmp_path))
        await trio.sleep(5)
        assert not ws.done.is_set()
        assert host.active == 1
        nursery.cancel_scope.cancel()


async def test_a_rotation_ends_a_real_websocket_and_sse_stream_and_the_session_loads_again(
    project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="maple_acp.net")
    async with net_host() as host, host.client() as client:
        opened = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
        assert opened.status_code == 200
        connection = {"Acp-Connection-Id": opened.headers["acp-connection-id"]}
        sse = host.headers(Accept="text/event-stream", **connection)
        ended: dict[str, float] = {}

        async def read_sse(task_status: trio.TaskStatus[None]) -> None:
            async with client.stream("GET", host.url, headers=sse) as stream:
                assert stream.status_code == 200
                task_status.started()
                with pytest.raises(StopAsyncIteration):
                    await drain(SseReader(stream))
            ended["sse"] = trio.current_time()

        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery, WsClient.connect(host) as ws:
                await nursery.start(read_sse)
                await ws.send(rpc("initialize", {"protocolVersion": 1}, 0))
                await ws.until(lambda m: m.get("id") == 0)
                await ws.send(rpc("session/new", {"cwd": str(project), "mcpServers": []}, 1))
                session_id = (await ws.until(lambda m: m.get("id") == 1))["result"]["sessionId"]
                rotated = trio.current_time()
                host.token = rotate_token(host.data_dir)
                while await ws.receive() is not None:
                    pass
                ended["ws"] = trio.current_time()
                assert ws.closed_code == 1000
            assert max(ended.values()) - rotated < 1.0
            # The Streamable HTTP connection is gone, even for the new token: its client
            # makes a new one.
            late = await client.post(
                host.url,
                content=rpc("session/list", {}, 2),
                headers=host.headers(**JSON, **connection),
            )
            assert late.status_code == 404
            while True:
                if not host.lifecycle.acp.status().connections:
                    break
                await trio.sleep(0.01)
            # The session was released with the connection and loads under the new token.
            async with WsClient.connect(host) as ws:
                await ws.send(rpc("initialize", {"protocolVersion": 1}, 0))
                await ws.until(lambda m: m.get("id") == 0)
                load = {"sessionId": session_id, "cwd": str(project), "mcpServers": []}
                await ws.send(rpc("session/load", load, 1))
                loaded = await ws.until(lambda m: m.get("id") == 1)
                assert "result" in loaded, loaded
    assert "ending 2 network connection(s) admitted under a token no longer in force" in (
        caplog.text
    )


async def test_a_token_file_made_readable_at_run_time_is_refused_with_503_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="maple_acp.net")
    async with net_host() as host, host.client() as client:
        opened = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
        assert opened.status_code == 200
        connection = {"Acp-Connection-Id": opened.headers["acp-connection-id"]}
        sse = host.headers(Accept="text/event-stream", **connection)
        with trio.fail_after(DEADLINE):
            async with client.stream("GET", host.url, headers=sse) as stream:
                events = SseReader(stream)
                os.chmod(token_path(host.data_dir), 0o644)
                os.utime(token_path(host.data_dir))
                ended = trio.current_time()
                with pytest.raises(StopAsyncIteration):
                    await drain(events)
                assert trio.current_time() - ended < 1.0
        statuses = []
        for _ in range(12):
            answer = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
            statuses.append(answer.status_code)
        # Refused, never a 500; and counted as failures like wrong tokens.
        assert statuses[:10] == [503] * 10
        assert statuses[10:] == [429, 429]
        os.chmod(token_path(host.data_dir), 0o600)
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warned] == [
        f"refusing every network request: the token file {token_path(host.data_dir)} must "
        "belong to this user with mode 0600; remove it and run `maple-acp http-token` to "
        "create a new one"
    ]
    assert not [r for r in caplog.records if r.exc_info]
    assert host.token not in caplog.text
    assert orjson.dumps(host.token).decode() not in caplog.text


async def drain(events: SseReader) -> None:
    while True:
        await events.next()
