"""The network carries an error answer as the peer wrote it: its reason in ``data.details``
as well as ``message``, whichever version the connection speaks."""

from __future__ import annotations

import pytest
import trio
from net_support import DEADLINE, WsClient, net_host, rpc


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
