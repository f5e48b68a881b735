"""The network carries an error answer as the peer wrote it: its reason in ``data.details``
as well as ``message``, over a WebSocket (either version) and Streamable HTTP."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from net_support import DEADLINE, INITIALIZE, WsClient, net_host, rpc, sse_events


@pytest.mark.parametrize("version", [1, 2])
async def test_an_error_over_a_websocket_carries_its_reason_in_data_details(version: int) -> None:
    async with net_host() as host:
        with trio.fail_after(DEADLINE):
            async with WsClient.connect(host) as ws:
                await ws.send(rpc("initialize", {"protocolVersion": version}, 0))
                await ws.until(lambda m: m.get("id") == 0)
                await ws.send(rpc("_vendor/none", {}, 1))
                error = (await ws.until(lambda m: m.get("id") == 1))["error"]
                assert error["code"] == -32601
                assert error["data"] == {"details": error["message"]}
                await ws.send(b'{"jsonrpc": "2.0", "id": 2, "method"')
                parse = (await ws.until(lambda m: "error" in m and m.get("id") is None))["error"]
                assert parse["code"] == -32700
                assert parse["data"] == {"details": parse["message"]}


async def test_an_error_over_streamable_http_carries_its_reason_in_data_details() -> None:
    json = {"Content-Type": "application/json"}
    async with net_host() as host, host.client() as client:
        opened = await client.post(host.url, content=INITIALIZE, headers=host.headers(**json))
        connection = {"Acp-Connection-Id": opened.headers["acp-connection-id"]}
        sse = host.headers(**connection, Accept="text/event-stream")
        with trio.fail_after(DEADLINE):
            async with client.stream("GET", host.url, headers=sse) as main:
                chunks = main.aiter_raw()
                await client.post(
                    host.url,
                    content=rpc("_vendor/none", {}, 1),
                    headers=host.headers(**json, **connection),
                )
                buffer = bytearray()
                answers: list[Any] = []
                while not answers:
                    buffer.extend(await chunks.__anext__())
                    answers = [m for _, m in sse_events(buffer) if m.get("id") == 1]
                error = answers[0]["error"]
                assert error["code"] == -32601
                assert error["data"] == {"details": error["message"]}
