"""ACP v2 (draft 2.0.0-alpha.12) beside v1: negotiation, the turn framed by ``state_update``,
upserts, resume with ``replayFrom``, JSON-RPC batches, and bad v2 input. Every frame the agent
sends on a v2 connection is checked against ``acp-schema/v2``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from edge_harness import Harness, running_service
from test_close import StallingBackend

from maple_acp.edge import CLOSE_DEADLINE_S, AcpServiceConfig
from maple_acp.rpc import MAX_BATCH_MESSAGES
from maple_acp.testing.client import AcpTestClient, reject
from maple_acp.testing.images import image_block, png
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError

V2_INFO = {"name": "v2-test", "version": "0"}


@pytest.fixture
async def v2_harness(tmp_path: Path) -> AsyncIterator[Harness]:
    config = AcpServiceConfig(protocol_max=2, allow_session_delete=True)
    async with running_service(tmp_path, config=config) as running:
        yield running


async def initialize_v2(client: AcpTestClient) -> Any:
    return await client.call(
        "initialize", {"protocolVersion": 2, "info": V2_INFO, "capabilities": {}}
    )


@asynccontextmanager
async def v2_client(harness: Harness, **options: Any) -> AsyncIterator[AcpTestClient]:
    async with harness.connect(**options) as client:
        answer = await initialize_v2(client)
        assert answer["protocolVersion"] == 2
        yield client


def states(client: AcpTestClient, sid: str) -> list[str]:
    return [
        u["state"] + (f":{u['stopReason']}" if u.get("stopReason") else "")
        for u in client.updates(sid)
        if u["sessionUpdate"] == "state_update"
    ]


async def wait_idle(client: AcpTestClient, sid: str, count: int = 1) -> None:
    with trio.fail_after(10):
        await client.wait_until(
            lambda: sum(s.startswith("idle:") for s in states(client, sid)) >= count
        )


async def test_a_library_host_answers_1_unless_it_opts_in(
    harness: Harness, acp_schema: AcpSchema
) -> None:
    async with harness.connect() as client:
        answer = await initialize_v2(client)
        assert answer["protocolVersion"] == 1
        assert answer["agentCapabilities"]["loadSession"] is True
        client.validate(acp_schema)


@pytest.mark.parametrize(
    ("requested", "version"), [(1, 1), (0, 1), (2, 2), (3, 2), (65535, 2), ("2", 1), (None, 1)]
)
async def test_negotiation(
    v2_harness: Harness,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
    requested: Any,
    version: int,
) -> None:
    async with v2_harness.connect() as client:
        params = {"protocolVersion": requested, "info": V2_INFO, "clientCapabilities": {}}
        if isinstance(requested, int):
            answer = await client.call("initialize", params)
            assert answer["protocolVersion"] == version
        else:
            # A version that is not a number is bad params, as in v1.
            with pytest.raises(ProtocolError) as caught:
                await client.call("initialize", params)
            assert caught.value.code == -32602
        # One version for the connection's life: a later initialize keeps it.
        again = await client.call("initialize", {**params, "protocolVersion": 1})
        assert again["protocolVersion"] == version
        client.validate(acp_schema_v2 if version == 2 else acp_schema)


async def test_initialize_advertises_the_session_baseline(
    v2_harness: Harness, acp_schema_v2: AcpSchema
) -> None:
    async with v2_harness.connect() as client:
        answer = await initialize_v2(client)
        session = answer["capabilities"]["session"]
        assert session["delete"] == {}
        assert session["mcp"] == {"http": {}, "acp": {}}
        assert answer["info"]["name"] == "maple-acp"
        assert "goal" in answer["_meta"]
        client.validate(acp_schema_v2)
    # The same prompt content as v1 offers, in v2's words.
    async with v2_harness.connect() as client:
        v1 = (await client.initialize())["agentCapabilities"]["promptCapabilities"]
    offered = {"image": v1["image"], "embeddedContext": v1["embeddedContext"]}
    assert set(session.get("prompt") or {}) == {key for key, on in offered.items() if on}
    assert offered["image"]  # the demo backend takes images: the mapping is exercised


async def test_stream_answers_on_acceptance_and_ends_idle(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        new = await client.call("session/new", {"cwd": str(project)})
        sid = new["sessionId"]
        assert {o["configId"] for o in new["configOptions"]} >= {"model", "mode"}
        answer = await client.prompt(sid, "/stream 50 100")
        message_id = answer["messageId"]
        await wait_idle(client, sid)
        updates = client.updates(sid)
        echoed = [u for u in updates if u["sessionUpdate"] == "user_message_chunk"]
        assert [u["messageId"] for u in echoed] == [message_id]
        chunks = [u for u in updates if u["sessionUpdate"] == "agent_message_chunk"]
        assert len("".join(c["content"]["text"] for c in chunks)) == 5000
        assert all(c["messageId"] == chunks[0]["messageId"] for c in chunks)
        assert states(client, sid) == ["running", "idle:end_turn"]
        # idle is the last update of the turn.
        assert updates[-1]["sessionUpdate"] == "state_update"
        client.validate(acp_schema_v2)


async def test_tools_allowed_and_rejected(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    for policy, marker_made in (("allow", True), ("reject", False)):
        options = {} if policy == "allow" else {"permission": reject}
        async with v2_client(v2_harness, **options) as client:
            sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
            marker = project / f"marker-{policy}"
            await client.prompt(sid, f'/tool shell {{"command": "touch {marker}"}}')
            await wait_idle(client, sid)
            assert marker.exists() is marker_made
            (question,) = client.permission_requests
            assert question["title"]
            assert question["subject"]["type"] == "tool_call"
            tool_id = question["subject"]["toolCall"]["toolCallId"]
            rows = [u for u in client.updates(sid) if u.get("toolCallId") == tool_id]
            # Upserts: every row of the tool, the first one too, is a tool_call_update.
            assert rows
            assert {u["sessionUpdate"] for u in rows} == {"tool_call_update"}
            assert rows[-1]["status"] == ("completed" if marker_made else "failed")
            assert states(client, sid) == [
                "running",
                "requires_action",
                "running",
                "idle:end_turn",
            ]
            client.validate(acp_schema_v2)


async def test_cancel_ends_idle_cancelled(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        await client.prompt(sid, "/hang")
        with trio.fail_after(10):
            await client.wait_until(lambda: "running" in states(client, sid))
        await client.cancel(sid)
        await wait_idle(client, sid)
        assert states(client, sid)[-1] == "idle:cancelled"
        # The session takes the next prompt.
        await client.prompt(sid, "/echo again")
        await wait_idle(client, sid, 2)
        assert client.text(sid).endswith("again")
        client.validate(acp_schema_v2)


async def test_close_during_a_turn_answers_and_stops_updates(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        await client.prompt(sid, "/hang")
        with trio.fail_after(10):
            await client.wait_until(lambda: "running" in states(client, sid))
        assert await client.close_session(sid) == {}
        after = len(client.updates(sid))
        await client.list_sessions()
        assert len(client.updates(sid)) == after
        client.validate(acp_schema_v2)


async def test_resume_replays_from_start_then_states_before_answering(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        await client.prompt(sid, "/echo remembered\n/plan [x] one")
        await wait_idle(client, sid)
    async with v2_client(v2_harness) as client:
        quiet = await client.call("session/resume", {"sessionId": sid, "cwd": str(project)})
        assert "configOptions" in quiet
        updates = client.updates(sid)
        assert not [u for u in updates if u["sessionUpdate"] == "agent_message_chunk"]
        assert states(client, sid) == ["idle"]
        await client.call("session/close", {"sessionId": sid})
    async with v2_client(v2_harness) as client:
        await client.call(
            "session/resume",
            {"sessionId": sid, "cwd": str(project), "replayFrom": {"type": "start"}},
        )
        # Whole messages (a client that held them already would be left with the same).
        [(user, said), (agent, answered)] = [(k, t) for k, _, t in client.messages(sid)]
        assert (user, agent, answered) == ("user_message", "agent_message", "remembered")
        assert said.startswith("/echo remembered")
        kinds = [u["sessionUpdate"] for u in client.updates(sid)]
        assert not [kind for kind in kinds if kind.endswith("_chunk")]
        assert "plan_update" in kinds
        # After the replay and the current state, the one end-of-replay marker, then the answer.
        assert kinds[-2:] == ["state_update", "replay_complete"]
        assert kinds.count("replay_complete") == 1
        assert client.updates(sid)[-1] == {"sessionUpdate": "replay_complete"}
        client.validate(acp_schema_v2)


async def test_every_resume_with_replay_from_ends_its_replay_once(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    resume = {"cwd": str(project), "replayFrom": {"type": "start"}}
    async with v2_client(v2_harness) as client:
        # An empty history (a session not prompted yet): the marker all the same.
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        with trio.fail_after(10):
            await client.wait_until(lambda: bool(client.updates(sid)))  # its commands
        seen = len(client.updates(sid))
        await client.call("session/resume", {"sessionId": sid, **resume})
        kinds = [u["sessionUpdate"] for u in client.updates(sid)[seen:]]
        assert kinds == ["available_commands_update", "state_update", "replay_complete"]
        # A re-attach by the connection that holds the session: once more, once.
        await client.prompt(sid, "/echo hi")
        await wait_idle(client, sid)
        seen = len(client.updates(sid))
        await client.call("session/resume", {"sessionId": sid, **resume})
        kinds = [u["sessionUpdate"] for u in client.updates(sid)[seen:]]
        assert kinds[0] == "user_message"
        assert kinds[-1] == "replay_complete"
        assert kinds.count("replay_complete") == 1
        # Without replayFrom: no marker.
        seen = len(client.updates(sid))
        await client.call("session/resume", {"sessionId": sid, "cwd": str(project)})
        assert "replay_complete" not in [u["sessionUpdate"] for u in client.updates(sid)[seen:]]
        client.validate(acp_schema_v2)


@pytest.mark.parametrize(
    "cursor",
    [{"type": "_vendor_cursor"}, {"type": "message", "id": "x"}, {"kind": "start"}, "start", 1],
)
async def test_a_replay_cursor_it_cannot_serve_is_bad_params(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema, cursor: Any
) -> None:
    async with v2_client(v2_harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        await client.prompt(sid, "/echo x")
        await wait_idle(client, sid)
    async with v2_client(v2_harness) as client:
        with pytest.raises(ProtocolError) as caught:
            await client.call(
                "session/resume", {"sessionId": sid, "cwd": str(project), "replayFrom": cursor}
            )
        assert caught.value.code == -32602
        # Nothing was attached: the connection is usable and the session resumes cleanly.
        assert client.updates(sid) == []
        await client.call("session/resume", {"sessionId": sid, "cwd": str(project)})
        client.validate(acp_schema_v2)


async def test_no_load_and_no_set_mode_in_v2(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        for method, params in (
            ("session/load", {"sessionId": sid, "cwd": str(project), "mcpServers": []}),
            ("session/set_mode", {"sessionId": sid, "modeId": "ask"}),
        ):
            with pytest.raises(ProtocolError) as caught:
                await client.call(method, params)
            assert caught.value.code == -32601
        client.validate(acp_schema_v2)


async def test_unknown_session_names_it(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        with pytest.raises(ProtocolError) as caught:
            await client.prompt("nope", "/echo x")
        assert caught.value.code == -32002
        assert caught.value.data == {"sessionId": "nope", "details": caught.value.message}
        client.validate(acp_schema_v2)
        acp_schema_v2.validate("SessionNotFoundErrorData", caught.value.data)


async def test_config_options_by_config_id(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        answer = await client.call(
            "session/set_config_option",
            {"sessionId": sid, "configId": "mode", "type": "id", "value": "ask"},
        )
        mode = next(o for o in answer["configOptions"] if o["configId"] == "mode")
        assert mode["currentValue"] == "ask"
        for bad in (
            {"type": "_vendor", "value": "ask"},
            {"type": "boolean", "value": True},
            {"type": "id", "value": 3},
            {"value": "ask"},
        ):
            with pytest.raises(ProtocolError) as caught:
                await client.call(
                    "session/set_config_option", {"sessionId": sid, "configId": "mode", **bad}
                )
            assert caught.value.code == -32602
        client.validate(acp_schema_v2)


async def test_an_unknown_permission_outcome_fails_closed(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    def vendor(params: Any) -> Any:
        return {"outcome": {"outcome": "_vendor_later", "why": "x"}}

    async with v2_client(v2_harness, permission=vendor) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        marker = project / "never"
        await client.prompt(sid, f'/tool shell {{"command": "touch {marker}"}}')
        await wait_idle(client, sid)
        assert not marker.exists()
        # The connection is still usable.
        await client.prompt(sid, "/echo fine")
        await wait_idle(client, sid, 2)
        client.validate(acp_schema_v2)


def answers(client: AcpTestClient, ids: set[Any]) -> dict[Any, Any]:
    return {
        m["id"]: m
        for m in client.inbound()
        if isinstance(m, dict) and "method" not in m and m.get("id") in ids
    }


def null_id_errors(client: AcpTestClient) -> list[Any]:
    return [
        m["error"]
        for m in client.inbound()
        if isinstance(m, dict) and "error" in m and m.get("id") is None
    ]


async def test_a_batch_runs_each_member_and_answers_each(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        batch = [
            {
                "jsonrpc": "2.0",
                "id": "b1",
                "method": "session/new",
                "params": {"cwd": str(project)},
            },
            {"jsonrpc": "2.0", "id": "b2", "method": "session/list", "params": {}},
            {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "none"}},
        ]
        await client.send_raw(orjson.dumps(batch))
        with trio.fail_after(10):
            await client.wait_until(lambda: len(answers(client, {"b1", "b2"})) == 2)
        got = answers(client, {"b1", "b2"})
        assert got["b1"]["result"]["sessionId"]
        assert "sessions" in got["b2"]["result"]
        client.validate(acp_schema_v2)


@pytest.mark.parametrize(
    ("line", "answered"),
    [
        (b"[]", 0),
        (orjson.dumps([{"jsonrpc": "2.0", "method": "x"}] * (MAX_BATCH_MESSAGES + 1)), 0),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "session/list"', 0),
        # Mixed garbage: each bad member is refused on its own, the good one is answered.
        (
            b'[1, "x", [], {"jsonrpc": "2.0"}, '
            b'{"jsonrpc": "2.0", "id": "ok", "method": "session/list", "params": {}}]',
            1,
        ),
    ],
)
async def test_bad_batches_are_refused_and_the_connection_goes_on(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema, line: bytes, answered: int
) -> None:
    async with v2_client(v2_harness) as client:
        await client.send_raw(line)
        # The connection is still usable, and the batch's refusals came before this answer
        # (its good member runs in a task of its own: its answer may come after this one).
        await client.list_sessions()
        if answered:
            with trio.fail_after(5):
                await client.wait_until(lambda: len(answers(client, {"ok"})) == answered)
        assert len(answers(client, {"ok"})) == answered
        errors = null_id_errors(client)
        assert errors
        assert {e["code"] for e in errors} <= {-32600, -32700}
        client.validate(acp_schema_v2)


async def test_a_v1_connection_refuses_batches(v2_harness: Harness, acp_schema: AcpSchema) -> None:
    async with v2_harness.connect() as client:
        await client.initialize()
        line = [{"jsonrpc": "2.0", "id": "b1", "method": "session/list", "params": {}}]
        await client.send_raw(orjson.dumps(line))
        await client.list_sessions()
        assert answers(client, {"b1"}) == {}
        assert [e["code"] for e in null_id_errors(client)] == [-32600]
        client.validate(acp_schema)


async def test_v2_close_returns_at_the_deadline(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, acp_schema_v2: AcpSchema
) -> None:
    backend = StallingBackend()
    project = tmp_path / "project"
    project.mkdir()
    config = AcpServiceConfig(protocol_max=2)
    async with (
        running_service(tmp_path, config=config, backend=backend) as harness,
        v2_client(harness) as client,
    ):
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        accepted = await client.prompt(sid, "stall")
        assert accepted["messageId"]
        await backend.started.wait()
        before = trio.current_time()
        assert await client.close_session(sid) == {}
        assert trio.current_time() - before == pytest.approx(CLOSE_DEADLINE_S)
        after = len(client.updates(sid))
        await backend.finished.wait()
        await trio.sleep(CLOSE_DEADLINE_S)
        # Nothing about the closed session after its close answer, not even an idle.
        assert len(client.updates(sid)) == after
        assert harness.runtime.lease_of(sid) is None
        assert harness.runtime.status().active_runs == 0
        client.validate(acp_schema_v2)


async def test_v2_close_during_a_permission_wait_denies(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    marker = project / "ran"
    asked = trio.Event()
    release = trio.Event()

    async def slow(params: Any) -> str:
        asked.set()
        await release.wait()
        return "allow"

    async with v2_client(v2_harness, permission=slow) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        await client.prompt(sid, f'/tool shell {{"command": "touch {marker}"}}')
        await asked.wait()
        assert states(client, sid)[-1] == "requires_action"
        await client.close_session(sid)
        release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert not marker.exists()
        assert v2_harness.runtime.lease_of(sid) is None
        client.validate(acp_schema_v2)


async def test_an_image_prompt_on_v2(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with v2_client(v2_harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        answer = await client.prompt(sid, [{"type": "text", "text": "look"}, image_block(png())])
        assert answer["messageId"]
        await wait_idle(client, sid)
        assert states(client, sid) == ["running", "idle:end_turn"]
        client.validate(acp_schema_v2)


async def test_live_updates_wait_for_the_end_of_a_replay(
    v2_harness: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    live = ("terminal_output_chunk", "terminal_update")
    async with v2_client(v2_harness) as client:
        sid = (await client.call("session/new", {"cwd": str(project)}))["sessionId"]
        # A history of a few hundred lines (several hand-offs to the peer) ...
        await client.prompt(sid, "/stream 400 16000")
        await wait_idle(client, sid)
        # ... and a command that prints all the while, past its turn.
        await client.prompt(sid, "/bg while :; do echo tick; sleep 0.005; done")
        await wait_idle(client, sid, 2)
        with trio.fail_after(10):
            await client.wait_until(
                lambda: any(u["sessionUpdate"] in live for u in client.updates(sid))
            )
        for _ in range(3):
            seen = len(client.updates(sid))
            resume = {"sessionId": sid, "cwd": str(project), "replayFrom": {"type": "start"}}
            await client.call("session/resume", resume)
            kinds = [u["sessionUpdate"] for u in client.updates(sid)[seen:]]
            first = kinds.index("user_message")
            end = kinds.index("replay_complete")
            assert not [kind for kind in kinds[first:end] if kind in live]
        await client.call(
            "_session/background", {"sessionId": sid, "action": "stop", "handle": "bg-1"}
        )
        client.validate(acp_schema_v2)
