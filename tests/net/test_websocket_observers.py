"""Following a desk's session from a phone over WebSockets: the phone attaches with
``_meta["maple.attach"] = "observe"``, gets the desk's permission question and answers it
first; the desk's question is withdrawn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import trio
from net_support import DEADLINE, WsClient, net_host, rpc


def is_update(message: Any, **fields: Any) -> bool:
    if message.get("method") != "session/update":
        return False
    update = message["params"]["update"]
    return all(update.get(key) == value for key, value in fields.items())


async def test_a_phone_follows_a_desk_session_and_answers_its_question(project: Path) -> None:
    async with net_host() as host:
        with trio.fail_after(DEADLINE):
            async with WsClient.connect(host) as desk, WsClient.connect(host) as phone:
                for ws in (desk, phone):
                    await ws.send(rpc("initialize", {"protocolVersion": 2, "capabilities": {}}, 0))
                    assert (await ws.until(lambda m: m.get("id") == 0))["result"][
                        "protocolVersion"
                    ] == 2
                await desk.send(rpc("session/new", {"cwd": str(project)}, 1))
                sid = (await desk.until(lambda m: m.get("id") == 1))["result"]["sessionId"]
                resume = {
                    "sessionId": sid,
                    "cwd": str(project),
                    "replayFrom": {"type": "start"},
                    "_meta": {"maple.attach": "observe"},
                }
                await phone.send(rpc("session/resume", resume, 1))
                assert "result" in await phone.until(lambda m: m.get("id") == 1)
                marker = project / "from-the-phone"
                command = "/tool shell " + json.dumps({"command": f"touch {marker}"})
                prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": command}]}
                await desk.send(rpc("session/prompt", prompt, 2))
                on_desk = await desk.until(
                    lambda m: m.get("method") == "session/request_permission"
                )
                on_phone = await phone.until(
                    lambda m: m.get("method") == "session/request_permission"
                )
                allow = next(
                    o["optionId"]
                    for o in on_phone["params"]["options"]
                    if o["kind"] == "allow_once"
                )
                answer = {"outcome": {"outcome": "selected", "optionId": allow}}
                await phone.send(
                    orjson.dumps({"jsonrpc": "2.0", "id": on_phone["id"], "result": answer})
                )
                withdrawn = await desk.until(lambda m: m.get("method") == "$/cancel_request")
                assert withdrawn["params"]["requestId"] == on_desk["id"]
                await phone.until(
                    lambda m: is_update(m, sessionUpdate="state_update", state="idle")
                )
                assert marker.exists()
