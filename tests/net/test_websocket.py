"""The WebSocket profile as the socket's connection serves it: a v2 batch answered as one
array, a v1 batch refused as on the socket, a client gone while a permission is asked (the tool
never runs, the slot comes back, the session opens elsewhere), and a message past the cap
ending only its own connection."""

from __future__ import annotations

from pathlib import Path

import orjson
import trio
from net_support import DEADLINE, WsClient, net_host, rpc


async def test_a_v2_batch_is_answered_as_one_array_and_a_v1_batch_is_refused() -> None:
    async with net_host() as host:
        with trio.fail_after(DEADLINE):
            async with WsClient.connect(host) as ws:
                await ws.send(rpc("initialize", {"protocolVersion": 2, "capabilities": {}}, 0))
                assert (await ws.until(lambda m: m.get("id") == 0))["result"][
                    "protocolVersion"
                ] == 2
                batch = [orjson.loads(rpc("session/list", {}, n)) for n in (1, 2)]
                await ws.send(orjson.dumps(batch))
                answer = await ws.receive()
                assert isinstance(answer, list)
                assert sorted(member["id"] for member in answer) == [1, 2]
            async with WsClient.connect(host) as ws:
                await ws.send(rpc("initialize", {"protocolVersion": 1}, 0))
                await ws.until(lambda m: m.get("id") == 0)
                await ws.send(orjson.dumps([orjson.loads(rpc("session/list", {}, 1))]))
                refused = await ws.receive()
                assert refused["error"]["code"] == -32600
                # The connection goes on.
                await ws.send(rpc("session/list", {}, 2))
                assert (await ws.until(lambda m: m.get("id") == 2))["result"] == {"sessions": []}


async def test_a_client_gone_during_a_permission_fails_closed(project: Path) -> None:
    async with net_host() as host:
        with trio.fail_after(DEADLINE):
            async with WsClient.connect(host) as ws:
                await ws.send(rpc("initialize", {"protocolVersion": 1}, 0))
                await ws.until(lambda m: m.get("id") == 0)
                await ws.send(rpc("session/new", {"cwd": str(project), "mcpServers": []}, 1))
                session_id = (await ws.until(lambda m: m.get("id") == 1))["result"]["sessionId"]
                tool = '/tool shell {"command": "touch must-not-exist"}'
                prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": tool}]}
                await ws.send(rpc("session/prompt", prompt, 2))
                await ws.until(lambda m: m.get("method") == "session/request_permission")
                # Gone without a close frame, as a dropped network is.
                await ws.stream.aclose()
            while True:
                if host.lifecycle.acp.status().connections == 0:
                    break
                await trio.sleep(0.01)
            assert not (project / "must-not-exist").exists()
            # The session was released with the connection: another client loads it.
            async with WsClient.connect(host) as ws:
                await ws.send(rpc("initialize", {"protocolVersion": 1}, 0))
                await ws.until(lambda m: m.get("id") == 0)
                load = {"sessionId": session_id, "cwd": str(project), "mcpServers": []}
                await ws.send(rpc("session/load", load, 1))
                loaded = await ws.until(lambda m: m.get("id") == 1)
                assert "result" in loaded, loaded
        assert not (project / "must-not-exist").exists()


async def test_a_message_past_the_cap_ends_only_its_own_connection() -> None:
    async with net_host(max_message_bytes=64 * 1024) as host:
        with trio.fail_after(DEADLINE):
            async with WsClient.connect(host) as other, WsClient.connect(host) as ws:
                await ws.send(rpc("session/list", {"pad": "x" * (128 * 1024)}, 1))
                assert await ws.receive() is None
                assert ws.closed_code == 1009
                await other.send(rpc("initialize", {"protocolVersion": 1}, 0))
                assert (await other.until(lambda m: m.get("id") == 0))["result"]
