"""No secret in the log at any level: a real ``maple-acp serve --http --log-level debug``
serves one session each over HTTP/1.1, h2c, TLS with HTTP/2 chosen by ALPN, and WebSocket,
every request carrying the bearer token and a ``Cookie``; the whole log is searched for both.

HTTP/2's header decoder logs every header it decodes at DEBUG (``Authorization`` included),
and the HTTP/1.1 and WebSocket libraries log what they parse: the host keeps all of them at
WARNING whatever ``--log-level`` says."""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
import wsproto
import wsproto.events
from e2e.host_processes import Host, private_short_dir, running_host
from net_support import DEADLINE, INITIALIZE, SseReader, rpc, self_signed_certificate

from maple_acp.net import read_or_create_token

#: What the host logs once the network listener is up (the URL follows).
SERVING_AT = "serving ACP over WebSocket and HTTP at "
COOKIE_VALUE = "cookie-SECRET-7d41e0b2"
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A socket path must fit in sun_path."""
    with private_short_dir() as path:
        yield path


@asynccontextmanager
async def debug_host(directory: Path, *args: str) -> AsyncIterator[tuple[Host, str, str]]:
    """``serve --http 127.0.0.1:0 --log-level debug``: the host, its URL and its token."""
    async with running_host(
        directory, "--http", "127.0.0.1:0", "--log-level", "debug", *args
    ) as host:
        with trio.fail_after(DEADLINE):
            line = await host.stderr.wait_for(lambda text: SERVING_AT in text)
        token = read_or_create_token(directory / "data")
        yield host, line.split(SERVING_AT, 1)[1].strip(), token


def _headers(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Cookie": f"pref={COOKIE_VALUE}", **extra}


async def http_session(url: str, token: str, client: httpx2.AsyncClient) -> str:
    """Initialize, open the connection's stream, ask ``session/list``; the HTTP version."""
    async with client:
        opened = await client.post(url, content=INITIALIZE, headers=_headers(token, **JSON))
        assert opened.status_code == 200
        connection = {"Acp-Connection-Id": opened.headers["acp-connection-id"]}
        with trio.fail_after(DEADLINE):
            stream_headers = _headers(token, Accept="text/event-stream", **connection)
            async with client.stream("GET", url, headers=stream_headers) as stream:
                assert stream.status_code == 200
                events = SseReader(stream)
                posted = await client.post(
                    url,
                    content=rpc("session/list", {}, 1),
                    headers=_headers(token, **JSON, **connection),
                )
                assert posted.status_code == 202
                _, answer = await events.until(lambda m: m.get("id") == 1)
        assert answer["result"] == {"sessions": []}
        return str(opened.http_version)


async def websocket_session(url: str, token: str) -> None:
    """Open the WebSocket with the token and a cookie, initialize, read the answer."""
    netloc = url.split("//", 1)[1].split("/", 1)[0]
    address, port = netloc.rsplit(":", 1)
    stream = await trio.open_tcp_stream(address, int(port))
    async with stream:
        ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        headers = [(k.encode(), v.encode()) for k, v in _headers(token).items()]
        await stream.send_all(
            ws.send(wsproto.events.Request(host=netloc, target="/acp", extra_headers=headers))
        )
        sent = False
        with trio.fail_after(DEADLINE):
            while True:
                data = await stream.receive_some(65536)
                assert data, "the server closed the WebSocket"
                ws.receive_data(data)
                for event in ws.events():
                    if isinstance(event, wsproto.events.AcceptConnection) and not sent:
                        await stream.send_all(
                            ws.send(wsproto.events.Message(data=INITIALIZE.decode()))
                        )
                        sent = True
                    elif isinstance(event, wsproto.events.TextMessage):
                        assert '"id":0' in event.data
                        await stream.send_all(ws.send(wsproto.events.CloseConnection(code=1000)))
                        return
                    else:
                        assert isinstance(event, wsproto.events.AcceptConnection), event


def assert_secret_free(host: Host, token: str) -> None:
    text = host.stderr.text
    # The log is at DEBUG for real (the check below would pass on an empty log).
    assert " DEBUG " in text
    assert token not in text
    assert token[: len(token) // 2] not in text
    assert COOKIE_VALUE not in text


def _client(**options: Any) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(trust_env=False, timeout=DEADLINE, follow_redirects=False, **options)


async def test_no_token_or_cookie_in_a_debug_log_over_http1_h2c_and_websocket(
    short_dir: Path,
) -> None:
    async with debug_host(short_dir) as (host, url, token):
        assert await http_session(url, token, _client()) == "HTTP/1.1"
        assert await http_session(url, token, _client(http1=False, http2=True)) == "HTTP/2"
        await websocket_session(url, token)
    assert_secret_free(host, token)


async def test_no_token_or_cookie_in_a_debug_log_over_tls_with_http2(short_dir: Path) -> None:
    cert, key = await trio.to_thread.run_sync(self_signed_certificate, short_dir)
    args = ("--tls-cert", os.fspath(cert), "--tls-key", os.fspath(key))
    async with debug_host(short_dir, *args) as (host, url, token):
        assert url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(cert))
        assert await http_session(url, token, _client(http2=True, verify=context)) == "HTTP/2"
    assert_secret_free(host, token)
