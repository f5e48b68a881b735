from __future__ import annotations

from pathlib import Path

from edge_harness import Harness

from maple_acp.testing.schema import AcpSchema


async def test_full_session_life(harness: Harness, project: Path, acp_schema: AcpSchema) -> None:
    async with harness.connect() as client:
        init = await client.initialize()
        assert init["protocolVersion"] == 1
        new = await client.new_session(str(project))
        sid = new["sessionId"]
        answer = await client.prompt(sid, "/echo hello")
        assert answer["stopReason"] == "end_turn"
        assert client.text(sid) == "hello"
        listed = await client.list_sessions()
        assert [s["sessionId"] for s in listed["sessions"]] == [sid]
        assert await client.close_session(sid) == {}
        client.validate(acp_schema)
