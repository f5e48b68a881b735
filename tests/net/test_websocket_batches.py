"""Over our server, the WebSocket writes a batch of messages at once (its ``SEND_MANY``
extension): every message still arrives whole, one WebSocket message each, in order."""

from __future__ import annotations

from pathlib import Path

import trio
from net_support import DEADLINE, WsClient, net_host, rpc

#: Enough chunks that the writer finds many queued at once.
CHUNKS = 2000


async def test_a_burst_arrives_as_whole_messages_in_order(project: Path) -> None:
    async with net_host() as host:
        with trio.fail_after(DEADLINE):
            async with WsClient.connect(host) as ws:
                await ws.send(rpc("initialize", {"protocolVersion": 1}, 0))
                await ws.until(lambda m: m.get("id") == 0)
                await ws.send(rpc("session/new", {"cwd": str(project), "mcpServers": []}, 1))
                session_id = (await ws.until(lambda m: m.get("id") == 1))["result"]["sessionId"]
                prompt = {
                    "sessionId": session_id,
                    "prompt": [{"type": "text", "text": f"/stream {CHUNKS} 7"}],
                }
                await ws.send(rpc("session/prompt", prompt, 2))
                text = ""
                while True:
                    message = await ws.receive()
                    assert message is not None, "the WebSocket closed first"
                    if message.get("id") == 2:
                        break
                    update = message["params"]["update"]
                    if update.get("sessionUpdate") == "agent_message_chunk":
                        text += update["content"]["text"]
                assert message["result"]["stopReason"] == "end_turn"
                assert text == "x" * 7 * CHUNKS
