"""Streamable HTTP over HTTP/2: h2c (prior knowledge) on a loopback socket, and h2 chosen by
ALPN over TLS with a certificate made for the test; the same connection, stream and answer as
over HTTP/1.1."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import httpx2
import pytest
import trio
from net_support import (
    DEADLINE,
    INITIALIZE,
    NetHost,
    SseReader,
    net_host,
    rpc,
    self_signed_certificate,
)

JSON = {"Content-Type": "application/json"}


async def list_over(host: NetHost, client: httpx2.AsyncClient) -> str:
    """Initialize, open the connection stream, ask session/list; the HTTP version used."""
    opened = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
    assert opened.status_code == 200
    connection = {"Acp-Connection-Id": opened.headers["acp-connection-id"]}
    headers = host.headers(**connection, Accept="text/event-stream")
    with trio.fail_after(DEADLINE):
        async with client.stream("GET", host.url, headers=headers) as stream:
            assert stream.status_code == 200
            events = SseReader(stream)
            posted = await client.post(
                host.url,
                content=rpc("session/list", {}, 1),
                headers=host.headers(**JSON, **connection),
            )
            assert posted.status_code == 202
            _, answer = await events.until(lambda m: m.get("id") == 1)
    assert answer["result"] == {"sessions": []}
    return str(opened.http_version)


async def test_h2c_with_prior_knowledge_on_loopback() -> None:
    async with net_host() as host:
        client = httpx2.AsyncClient(
            trust_env=False, timeout=DEADLINE, follow_redirects=False, http1=False, http2=True
        )
        async with client:
            assert await list_over(host, client) == "HTTP/2"


async def test_tls_offers_http2_by_alpn(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not on this machine")
    cert, key = await trio.to_thread.run_sync(self_signed_certificate, tmp_path)
    async with net_host(tls_cert=cert, tls_key=key) as host:
        assert host.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(cert))
        client = httpx2.AsyncClient(
            trust_env=False, timeout=DEADLINE, follow_redirects=False, http2=True, verify=context
        )
        async with client:
            assert await list_over(host, client) == "HTTP/2"


async def test_the_listener_stops_with_the_host_within_the_five_second_bound() -> None:
    ended = trio.Event()

    async def read_to_the_end(host: NetHost, client: httpx2.AsyncClient, headers: dict[str, str],
                              task_status: trio.TaskStatus[None]) -> None:  # fmt: skip
        async with client.stream("GET", host.url, headers=headers) as stream:
            assert stream.status_code == 200
            task_status.started()
            async for _ in stream.aiter_bytes():
                pass
        ended.set()

    async with trio.open_nursery() as nursery:
        async with net_host() as host:
            # The client outlives the host: its stream must be ended by the host's stop.
            client = host.client()
            opened = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
            headers = host.headers(
                Accept="text/event-stream",
                **{"Acp-Connection-Id": opened.headers["acp-connection-id"]},
            )
            await nursery.start(read_to_the_end, host, client, headers)
            assert host.lifecycle.acp.status().connections == 1
            started = trio.current_time()
        # Leaving the block stopped the host: the ACP connection first, then the listener.
        assert trio.current_time() - started < 5.0
        with trio.fail_after(DEADLINE):
            await ended.wait()
        await client.aclose()
