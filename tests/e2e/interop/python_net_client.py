"""Drives ``maple-acp serve --http`` with the official Python SDK's network clients
(``agent-client-protocol``): its WebSocket client (``acp.ws``) or its Streamable HTTP client
(``acp.http.create_http_stream``).

argv: URL TOKEN ws|http PROJECT FRAMES. The scenario: initialize, ``session/new``, a streamed
prompt, a permission allowed and one denied, a cancelled prompt, ``session/list``; then a new
connection (a reconnect) that loads the session (its history replayed), resumes it, closes it.
Every message each way is written to FRAMES (one JSON object a line) for the test to check
against the schema; one JSON line of what it saw goes to stdout. Any failure exits non-zero.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from acp import connect_to_agent, text_block
from acp.http import create_http_stream
from acp.interfaces import Client
from acp.schema import AllowedOutcome, RequestPermissionResponse
from acp.ws import create_websocket_stream

URL, TOKEN, KIND, PROJECT, FRAMES = sys.argv[1:6]
STEP_S = 20.0


class Recorded:
    """The SDK's transport, with every message it moves written to FRAMES."""

    def __init__(self, inner: Any, log: Any) -> None:
        self._inner = inner
        self._log = log

    async def send(self, message: dict[str, Any]) -> None:
        self._log.write(json.dumps({"direction": "out", "message": message}) + "\n")
        await self._inner.send(message)

    async def receive(self) -> dict[str, Any] | None:
        message = await self._inner.receive()
        if message is not None:
            self._log.write(json.dumps({"direction": "in", "message": message}) + "\n")
        return message

    async def close(self) -> None:
        await self._inner.close()


class Recorder(Client):  # type: ignore[misc]
    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.answers = ["allow", "reject"]
        self.asked: list[str] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))

    async def request_permission(
        self, options: Any, session_id: str, tool_call: Any, **kwargs: Any
    ) -> RequestPermissionResponse:
        wanted = self.answers.pop(0)
        self.asked.append(wanted)
        chosen = next(o for o in options if o.kind.startswith(wanted))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=chosen.option_id)
        )

    def text(self, session_id: str, kind: str = "agent_message_chunk") -> str:
        return "".join(
            getattr(getattr(u, "content", None), "text", "")
            for sid, u in self.updates
            if sid == session_id and u.session_update == kind
        )

    def kinds(self, session_id: str) -> list[str]:
        return [u.session_update for sid, u in self.updates if sid == session_id]


async def open_transport(log: Any) -> Recorded:
    # Request ids start again on each connection: the test checks each one apart.
    log.write(json.dumps({"direction": "connection"}) + "\n")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if KIND == "ws":
        inner = await create_websocket_stream(URL.replace("http", "ws", 1), headers=headers)
    else:
        inner = create_http_stream(URL, headers=headers)
    return Recorded(inner, log)


async def until(check: Any) -> None:
    async with asyncio.timeout(STEP_S):
        while True:
            if check():
                return
            await asyncio.sleep(0.01)


async def main() -> None:
    report: dict[str, Any] = {}
    with open(FRAMES, "w") as log:
        client = Recorder()
        conn = connect_to_agent(client, await open_transport(log))
        async with asyncio.timeout(STEP_S):
            init = await conn.initialize(protocol_version=1)
        report["protocolVersion"] = init.protocol_version
        created = await conn.new_session(cwd=PROJECT, mcp_servers=[])
        sid = created.session_id
        answer = await conn.prompt(session_id=sid, prompt=[text_block("/stream 20 50")])
        await until(lambda: len(client.text(sid)) >= 1000)
        report["streamed"] = len(client.text(sid))
        report["streamStop"] = answer.stop_reason
        # Text beyond ASCII, long enough to cross many reads of the client's stream.
        wide = "é€😀 " * 20000
        before = len(client.text(sid))
        await conn.prompt(session_id=sid, prompt=[text_block(wide)])
        await until(lambda: len(client.text(sid)) >= before + len(wide))
        report["wideText"] = client.text(sid)[before:] == wide
        allowed = await conn.prompt(
            session_id=sid,
            prompt=[text_block('/tool shell {"command": "touch allowed-marker"}')],
        )
        denied = await conn.prompt(
            session_id=sid,
            prompt=[text_block('/tool shell {"command": "touch denied-marker"}')],
        )
        report["permissions"] = client.asked
        report["permissionStops"] = [allowed.stop_reason, denied.stop_reason]
        hang = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text_block("/hang")]))
        await asyncio.sleep(0.2)
        await conn.cancel(session_id=sid)
        async with asyncio.timeout(STEP_S):
            report["cancelStop"] = (await hang).stop_reason
        listed = await conn.list_sessions(cwd=PROJECT)
        report["listed"] = sid in [s.session_id for s in listed.sessions]
        await conn.close()

        # A reconnect: a new connection loads the session, then resumes and closes it.
        again = Recorder()
        conn = connect_to_agent(again, await open_transport(log))
        async with asyncio.timeout(STEP_S):
            await conn.initialize(protocol_version=1)
            await conn.load_session(cwd=PROJECT, session_id=sid, mcp_servers=[])
        # Over Streamable HTTP the load's answer and the session's replay come on two streams,
        # so the replay may still be arriving when the answer does: wait for all of its text
        # (the streamed 1,000 characters and the wide message), then count it exactly.
        await until(lambda: "/stream 20 50" in again.text(sid, "user_message_chunk"))
        await until(lambda: len(again.text(sid)) >= 1000 + len(wide))
        report["replayedText"] = len(again.text(sid)) - len(wide)
        report["replayedKinds"] = sorted(set(again.kinds(sid)))
        async with asyncio.timeout(STEP_S):
            resumed = await conn.resume_session(cwd=PROJECT, session_id=sid, mcp_servers=[])
            report["resumedModes"] = resumed.modes is not None
            await conn.close_session(session_id=sid)
            listed = await conn.list_sessions(cwd=PROJECT)
        report["listedAfterClose"] = sid in [s.session_id for s in listed.sessions]
        await conn.close()
    print(json.dumps(report))


asyncio.run(main())
