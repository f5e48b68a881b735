"""An event stream says something as soon as it opens: a comment line, before any event and
long before the first keepalive (15 s), over HTTP/1.1 and HTTP/2, for the connection stream and
a session's stream. A proxy that holds response headers until the first body byte (nginx over
HTTP/2) so passes the stream on at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from h2c_client import H2cClient
from net_support import DEADLINE, INITIALIZE, net_host, rpc, sse_events

from maple_acp.net._http import STREAM_OPENED

JSON = {"Content-Type": "application/json"}
#: Far below the keepalive: the first bytes come at once or the test fails.
AT_ONCE_S = 2.0


async def test_a_stream_writes_a_comment_as_soon_as_it_opens_over_http1(project: Path) -> None:
    async with net_host() as host, host.client() as client:
        opened = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
        connection = {"Acp-Connection-Id": opened.headers["acp-connection-id"]}
        sse = host.headers(**connection, Accept="text/event-stream")
        with trio.fail_after(DEADLINE):
            async with client.stream("GET", host.url, headers=sse) as main:
                chunks = main.aiter_raw()
                with trio.fail_after(AT_ONCE_S):
                    first = await chunks.__anext__()
                assert first == STREAM_OPENED
                new = rpc("session/new", {"cwd": str(project), "mcpServers": []}, 1)
                await client.post(host.url, content=new, headers=host.headers(**JSON, **connection))
                buffer = bytearray()
                answers: list[Any] = []
                while not answers:
                    buffer.extend(await chunks.__anext__())
                    answers = [m for _, m in sse_events(buffer) if m.get("id") == 1]
                created = answers[0]
                named = {**sse, "Acp-Session-Id": created["result"]["sessionId"]}
                async with client.stream("GET", host.url, headers=named) as session:
                    assert session.status_code == 200
                    with trio.fail_after(AT_ONCE_S):
                        first = await session.aiter_raw().__anext__()
                    assert first == STREAM_OPENED


async def test_a_stream_writes_a_comment_as_soon_as_it_opens_over_h2c() -> None:
    async with net_host() as host, trio.open_nursery() as nursery:
        address, port = host.address
        client = await H2cClient.connect(address, port)
        nursery.start_soon(client.run)
        with trio.fail_after(DEADLINE):
            json = {"content-type": "application/json"}
            status, headers, _ = await client.answer(
                await client.request("POST", host.headers(**json), INITIALIZE)
            )
            assert status == 200
            connection = {"acp-connection-id": headers[b"acp-connection-id"].decode()}
            main = await client.request(
                "GET", host.headers(**connection, accept="text/event-stream")
            )
        with trio.fail_after(AT_ONCE_S):
            await client.until(lambda: len(client.body[main]) >= len(STREAM_OPENED))
        assert client.headers[main][b":status"] == b"200"
        assert bytes(client.body[main]) == STREAM_OPENED
        await client.aclose()
        nursery.cancel_scope.cancel()
