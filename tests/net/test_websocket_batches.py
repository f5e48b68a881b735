"""Over our server, the WebSocket writes a batch of messages at once (its ``SEND_MANY``
extension), framed by us rather than wsproto: every message still arrives whole, one WebSocket
message each, in order, in the very frame wsproto would write."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from net_support import DEADLINE, WsClient, net_host, rpc
from wsproto.connection import Connection, ConnectionType
from wsproto.events import TextMessage

from maple_acp.net._hypercorn_ws import text_frame_header

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


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_our_text_frame_is_the_one_wsproto_writes(size: int) -> None:
    text = "é" * (size // 2) + "x" * (size % 2)
    data = text.encode()
    expected = Connection(ConnectionType.SERVER).send(TextMessage(data=text))
    assert text_frame_header(len(data)) + data == expected
    # And a client reads it back as that one message.
    client = Connection(ConnectionType.CLIENT)
    client.receive_data(expected)
    (event,) = list(client.events())
    assert isinstance(event, TextMessage)
    assert (event.data, event.message_finished) == (text, True)
