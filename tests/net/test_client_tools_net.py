"""MCP over ACP across the network: a WebSocket client and a Streamable HTTP client each offer a
tool that lives in them; the host's ``mcp/message`` requests reach them and their answers come
back over the same connection (the edge does not know the transport), every frame checked
against the schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import trio
from net_support import DEADLINE, SseReader, WsClient, net_host, rpc

from maple_acp.testing.schema import AcpSchema, validate_frames

JSON = {"Content-Type": "application/json"}
TOOL = {
    "name": "now",
    "description": "The page's clock",
    "inputSchema": {"type": "object", "properties": {}},
}


def inner_answer(params: dict[str, Any]) -> dict[str, Any]:
    """What a page answers to each inner MCP request (by hand, as a page would)."""
    method, inner = params["method"], params.get("params") or {}
    if method == "initialize":
        return {
            "result": {
                "protocolVersion": inner["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "page", "version": "1"},
            }
        }
    if method == "tools/list":
        return {"result": {"tools": [TOOL]}}
    return {"result": {"content": [{"type": "text", "text": "12:00"}]}}


async def test_a_websocket_client_offers_a_tool_through_mcp_message(
    project: Path, acp_schema: AcpSchema
) -> None:
    received: list[Any] = []
    sent: list[Any] = []
    seen: list[dict[str, Any]] = []

    async def send(ws: WsClient, message: bytes) -> None:
        sent.append(orjson.loads(message))
        await ws.send(message)

    async def until(ws: WsClient, done: Any) -> Any:
        """The next message ``done`` accepts, answering the host's requests meanwhile."""
        while True:
            message = await ws.receive()
            assert message is not None, "the WebSocket closed first"
            received.append(message)
            if message.get("method") == "mcp/message":
                seen.append(message["params"])
                outcome = inner_answer(message["params"])
                answer = {"jsonrpc": "2.0", "id": message["id"], "result": outcome}
                await send(ws, orjson.dumps(answer))
            elif message.get("method") == "session/request_permission":
                options = message["params"]["options"]
                chosen = next(o for o in options if o["kind"] == "allow_once")["optionId"]
                outcome = {"outcome": {"outcome": "selected", "optionId": chosen}}
                await send(
                    ws, orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": outcome})
                )
            if done(message):
                return message

    async with net_host() as host:
        with trio.fail_after(DEADLINE):
            async with WsClient.connect(host) as ws:
                await send(
                    ws, rpc("initialize", {"protocolVersion": 1, "clientCapabilities": {}}, 0)
                )
                init = await until(ws, lambda m: m.get("id") == 0 and "method" not in m)
                assert init["result"]["agentCapabilities"]["mcpCapabilities"]["acp"] is True
                server = {"type": "acp", "name": "page", "serverId": "tab-1"}
                await send(ws, rpc("session/new", {"cwd": str(project), "mcpServers": [server]}, 1))
                sid = (await until(ws, lambda m: m.get("id") == 1 and "method" not in m))["result"][
                    "sessionId"
                ]
                assert [s["method"] for s in seen] == ["initialize", "tools/list"]
                prompt = [{"type": "text", "text": "/mcp page__now {}"}]
                await send(ws, rpc("session/prompt", {"sessionId": sid, "prompt": prompt}, 2))
                answer = await until(ws, lambda m: m.get("id") == 2 and "method" not in m)
                assert answer["result"]["stopReason"] == "end_turn"
    [call] = [s for s in seen if s["method"] == "tools/call"]
    assert call["serverId"] == "tab-1"
    assert call["_meta"]["maple.sessionId"] == sid
    updates = [m["params"]["update"] for m in received if m.get("method") == "session/update"]
    final = [u for u in updates if u.get("toolCallId") == call["_meta"]["maple.toolCallId"]][-1]
    assert final["status"] == "completed"
    assert final["rawOutput"]["content"] == [{"type": "text", "text": "12:00"}]
    frames = [("out", m) for m in sent] + [("in", m) for m in received]
    # Answers are checked against the requests they answer, so the requests go first.
    assert validate_frames(acp_schema, frames) == len(received)


async def test_a_streamable_http_client_offers_a_tool_through_mcp_message(
    project: Path, acp_schema: AcpSchema
) -> None:
    received: list[Any] = []
    sent: list[Any] = []
    seen: list[dict[str, Any]] = []
    async with net_host() as host, host.client() as client:

        async def post(body: bytes, **headers: str) -> None:
            sent.append(orjson.loads(body))
            answer = await client.post(host.url, content=body, headers=host.headers(**headers))
            assert answer.status_code in (200, 202), answer.status_code

        async def until(stream: SseReader, done: Any, connection: str) -> Any:
            """The next event ``done`` accepts, answering the host's requests by POST."""
            while True:
                _, message = await stream.next()
                received.append(message)
                answer: Any = None
                if message.get("method") == "mcp/message":
                    seen.append(message["params"])
                    answer = inner_answer(message["params"])
                elif message.get("method") == "session/request_permission":
                    options = message["params"]["options"]
                    chosen = next(o for o in options if o["kind"] == "allow_once")["optionId"]
                    answer = {"outcome": {"outcome": "selected", "optionId": chosen}}
                if answer is not None:
                    reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer}
                    await post(orjson.dumps(reply), **JSON, **{"Acp-Connection-Id": connection})
                if done(message):
                    return message

        with trio.fail_after(DEADLINE):
            initialize = rpc("initialize", {"protocolVersion": 1, "clientCapabilities": {}}, 0)
            sent.append(orjson.loads(initialize))
            opened = await client.post(host.url, content=initialize, headers=host.headers(**JSON))
            received.append(opened.json())
            connection = opened.headers["acp-connection-id"]
            named = {"Acp-Connection-Id": connection}
            events = host.headers(**named, Accept="text/event-stream")
            async with client.stream("GET", host.url, headers=events) as main_response:
                main = SseReader(main_response)
                server = {"type": "acp", "name": "page", "serverId": "tab-1"}
                new = {"cwd": str(project), "mcpServers": [server]}
                await post(rpc("session/new", new, 1), **JSON, **named)
                # The session's id is not known yet: its set-up comes on the connection's stream.
                created = await until(
                    main, lambda m: m.get("id") == 1 and "method" not in m, connection
                )
                sid = created["result"]["sessionId"]
                assert [s["method"] for s in seen] == ["initialize", "tools/list"]
                session_events = {**events, "Acp-Session-Id": sid}
                async with client.stream("GET", host.url, headers=session_events) as response:
                    session = SseReader(response)
                    prompt = [{"type": "text", "text": "/mcp page__now {}"}]
                    body = rpc("session/prompt", {"sessionId": sid, "prompt": prompt}, 2)
                    await post(body, **JSON, **named, **{"Acp-Session-Id": sid})
                    answer = await until(
                        session, lambda m: m.get("id") == 2 and "method" not in m, connection
                    )
                    assert answer["result"]["stopReason"] == "end_turn"
    [call] = [s for s in seen if s["method"] == "tools/call"]
    assert call["_meta"]["maple.sessionId"] == sid
    frames = [("out", m) for m in sent] + [("in", m) for m in received]
    assert validate_frames(acp_schema, frames) == len(received)
