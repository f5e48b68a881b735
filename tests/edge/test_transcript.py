"""``_maple/transcript`` (what ``maple-acp sessions show`` reads): a stored session's history
replayed as a load replays it, without a lease and without a model, so a session held by
another connection is shown as it stands; its bad forms are refused in one line and the
connection goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
from edge_harness import Harness, running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import TRANSCRIPT_METHOD, ProtocolError


async def test_a_transcript_is_what_a_load_replays_and_takes_no_lease(
    harness: Harness, project: Path, acp_schema: AcpSchema
) -> None:
    async with harness.connect(initialize=True) as holder:
        sid = (await holder.new_session(str(project)))["sessionId"]
        await holder.prompt(sid, "/think hmm\n/echo kept\n/plan [x] one")
        async with harness.connect(initialize=True) as viewer:
            # The holder keeps the session open: the viewer reads it all the same.
            assert await viewer.call(TRANSCRIPT_METHOD, {"sessionId": sid}) == {}
            shown = viewer.updates(sid)
            viewer.validate(acp_schema)
        # The holder was not disturbed: its session takes the next prompt.
        assert (await holder.prompt(sid, "/echo still mine"))["stopReason"] == "end_turn"
        await holder.close_session(sid)
    async with harness.connect(initialize=True) as loader:
        await loader.load_session(sid, str(project))
        replayed = [
            u for u in loader.updates(sid) if u["sessionUpdate"] != "available_commands_update"
        ]
    assert shown == replayed[: len(shown)]
    assert len(replayed) > len(shown)
    assert {"user_message_chunk", "agent_thought_chunk", "agent_message_chunk", "plan"} <= {
        u["sessionUpdate"] for u in shown
    }


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"sessionId": "no-such-session"}, -32002),
        ({"sessionId": "  "}, -32602),
        ({}, -32602),
        ([1], -32602),
    ],
)
async def test_bad_transcript_requests_are_refused_and_the_connection_goes_on(
    harness: Harness, project: Path, params: object, code: int
) -> None:
    async with harness.connect(initialize=True) as client:
        with pytest.raises(ProtocolError) as refused:
            await client.call(TRANSCRIPT_METHOD, params)
        assert refused.value.code == code
        assert "\n" not in refused.value.message
        assert (await client.list_sessions()) == {"sessions": []}


async def test_a_session_outside_this_services_roots_is_not_shown(
    tmp_path: Path, project: Path
) -> None:
    async with running_service(tmp_path) as open_host, open_host.connect(initialize=True) as c:
        sid = (await c.new_session(str(project)))["sessionId"]
        await c.prompt(sid, "/echo elsewhere")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = AcpServiceConfig(allowed_roots=(str(elsewhere),))
    async with (
        running_service(tmp_path, config=config) as narrow,
        narrow.connect(initialize=True) as client,
    ):
        with pytest.raises(ProtocolError) as refused:
            await client.call(TRANSCRIPT_METHOD, {"sessionId": sid})
        assert refused.value.code == -32002
        assert client.updates(sid) == []
