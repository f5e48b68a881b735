"""MCP servers that live in the client (MCP over ACP) through the real wire: a running ACP
service over the demo runtime and a real SQLite file, and a test client that answers the host's
``mcp/message`` requests (by hand, or with the MCP SDK's server in-process)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from acp_support import AcpHarness, running_acp
from client_tools import (
    BIG_TEXT_CHARS,
    STATELESS_VERSION,
    STATELESS_VERSION_KEY,
    ScriptedTools,
    SdkTools,
    acp_server,
)

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.client import AcpTestClient, reject
from maple_acp.testing.schema import AcpSchema, validate_frames
from maple_acp.wire import INVALID_PARAMS, ProtocolError


@pytest.fixture
def schemas(acp_schema: AcpSchema, acp_schema_v2: AcpSchema) -> tuple[AcpSchema, AcpSchema]:
    return acp_schema, acp_schema_v2


def tool_rows(client: AcpTestClient, sid: str) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {}
    for update in client.updates(sid):
        if update.get("sessionUpdate") in ("tool_call", "tool_call_update"):
            rows.setdefault(update["toolCallId"], []).append(update)
    return rows


def only_row(client: AcpTestClient, sid: str) -> tuple[str, list[dict[str, Any]]]:
    rows = tool_rows(client, sid)
    assert len(rows) == 1, rows
    return next(iter(rows.items()))


def shown(update: dict[str, Any]) -> str:
    return "".join(part["content"]["text"] for part in update.get("content", []))


def position_of_answer(client: AcpTestClient, request_id: str) -> int:
    for index, frame in enumerate(client.frames):
        message = frame.message
        if (
            frame.direction == "in"
            and isinstance(message, dict)
            and message.get("id") == request_id
        ) and "method" not in message:
            return index
    raise AssertionError(f"no answer to {request_id}")


def mcp_message_positions(client: AcpTestClient) -> list[int]:
    return [
        index
        for index, frame in enumerate(client.frames)
        if frame.direction == "in"
        and isinstance(frame.message, dict)
        and frame.message.get("method") == "mcp/message"
    ]


def inner_requests(client: AcpTestClient, method: str) -> list[dict[str, Any]]:
    """The ``mcp/message`` requests the client got for the inner ``method``."""
    return [
        f.message
        for f in client.frames
        if f.direction == "in"
        and isinstance(f.message, dict)
        and f.message.get("method") == "mcp/message"
        and f.message["params"]["method"] == method
    ]


def cancels(client: AcpTestClient) -> list[dict[str, Any]]:
    """The params of every ``$/cancel_request`` the client got."""
    return [
        f.message["params"]
        for f in client.frames
        if f.direction == "in"
        and isinstance(f.message, dict)
        and f.message.get("method") == "$/cancel_request"
    ]


async def withdrawn(client: AcpTestClient, tools: ScriptedTools, count: int) -> None:
    """Wait for ``count`` requests withdrawn by the host, and their handlers' end."""
    await client.wait_until(lambda: len(cancels(client)) >= count)
    await trio.testing.wait_all_tasks_blocked()
    assert len(cancels(client)) == count
    assert tools.abandoned == count


#: A service that speaks both versions.
BOTH_VERSIONS = AcpServiceConfig(protocol_max=2)


async def initialize(client: AcpTestClient, version: int) -> Any:
    if version == 1:
        return await client.initialize()
    return await client.call(
        "initialize",
        {"protocolVersion": 2, "info": {"name": "t", "version": "0"}, "capabilities": {}},
    )


@asynccontextmanager
async def versioned(
    tmp_path: Path, version: int, schemas: tuple[AcpSchema, AcpSchema], **options: Any
) -> AsyncIterator[tuple[AcpHarness, AcpTestClient, AcpSchema]]:
    """A service speaking both versions and one client initialized at ``version``, every frame
    it gets checked against that version's schema."""
    schema = schemas[version - 1]
    async with (
        running_acp(tmp_path, config=BOTH_VERSIONS) as acp,
        acp.connect(initialize=False, schema=schema, **options) as client,
    ):
        await initialize(client, version)
        yield acp, client, schema


def idle_count(client: AcpTestClient, sid: str) -> int:
    return sum(
        1
        for update in client.updates(sid)
        if update.get("sessionUpdate") == "state_update" and update.get("state") == "idle"
    )


async def run_prompt(client: AcpTestClient, sid: str, text: str, version: int) -> None:
    """A prompt's whole turn: v1 answers at its end, v2 on acceptance (then its idle state)."""
    before = idle_count(client, sid)
    await client.prompt(sid, text)
    if version == 2:
        await client.wait_until(lambda: idle_count(client, sid) > before)


def row_ended(client: AcpTestClient, sid: str) -> bool:
    rows = tool_rows(client, sid)
    return bool(rows) and all(r[-1].get("status") in ("completed", "failed") for r in rows.values())


# -- the catalog and a call --------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
async def test_the_clients_tools_are_set_up_before_the_answer_and_called_with_permission(
    tmp_path: Path,
    project: Path,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
    version: int,
) -> None:
    schema = acp_schema if version == 1 else acp_schema_v2
    tools = ScriptedTools()
    async with (
        running_acp(tmp_path, config=BOTH_VERSIONS) as acp,
        acp.connect(initialize=False, schema=schema) as client,
    ):
        tools.attach(client)
        init = await initialize(client, version)
        if version == 1:
            assert init["agentCapabilities"]["mcpCapabilities"]["acp"] is True
        else:
            assert init["capabilities"]["session"]["mcp"]["acp"] == {}
        new_id = await client.send(
            "session/new", {"cwd": str(project), "mcpServers": [acp_server()]}
        )
        await client.wait_until(lambda: client.answer(new_id) is not None)
        sid = client.answer(new_id)["result"]["sessionId"]
        # Set-up happened before the answer, about the session the answer names, and the inner
        # notifications/initialized was never sent.
        assert [seen["method"] for seen in tools.seen] == ["initialize", "tools/list"]
        assert max(mcp_message_positions(client)) < position_of_answer(client, new_id)
        for seen in tools.seen:
            assert seen["serverId"] == "page-1"
            assert seen["_meta"] == {"maple.sessionId": sid}

        await client.prompt(sid, '/mcp page__add {"a": 2, "b": 40}')
        await client.wait_until(lambda: row_ended(client, sid))
        assert len(client.permission_requests) == 1
        tool_call_id, updates = only_row(client, sid)
        assert updates[-1]["status"] == "completed"
        assert updates[-1]["rawOutput"] == {
            "content": [{"type": "text", "text": "42"}],
            "isError": False,
            "structuredContent": {"result": 42},
        }
        [call] = tools.inner("tools/call")
        assert call["params"] == {"name": "add", "arguments": {"a": 2, "b": 40}}
        assert call["_meta"] == {"maple.sessionId": sid, "maple.toolCallId": tool_call_id}
        assert isinstance(call["requestId"], str)
        assert client.validate(schema) > 0


@pytest.mark.parametrize("version", [1, 2])
async def test_a_denied_call_never_reaches_the_client_server(
    tmp_path: Path, project: Path, schemas: tuple[AcpSchema, AcpSchema], version: int
) -> None:
    tools = ScriptedTools()
    async with versioned(tmp_path, version, schemas, permission=reject) as (_, client, schema):
        tools.attach(client)
        sid = (await client.new_session(str(project), mcp_servers=[acp_server()]))["sessionId"]
        await run_prompt(client, sid, '/mcp page__echo {"text": "no"}', version)
        assert len(client.permission_requests) == 1
        _, updates = only_row(client, sid)
        assert updates[-1]["status"] == "failed"
        assert shown(updates[-1]) == "permission denied"
        assert tools.inner("tools/call") == []
        client.validate(schema)


async def test_a_load_sets_the_tools_up_for_the_loaded_session(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    tools = ScriptedTools()
    async with running_acp(tmp_path) as acp:
        async with acp.connect() as first:
            sid = (await first.new_session(str(project)))["sessionId"]
            await first.prompt(sid, "hello")
        async with acp.connect() as client:
            tools.attach(client)
            await client.load_session(sid, str(project), mcp_servers=[acp_server()])
            assert [seen["_meta"]["maple.sessionId"] for seen in tools.seen] == [sid, sid]
            await client.prompt(sid, '/mcp page__echo {"text": "again"}')
            assert only_row(client, sid)[1][-1]["status"] == "completed"
            client.validate(acp_schema)


async def test_a_fork_sets_the_tools_up_for_the_new_session(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    tools = ScriptedTools()
    async with running_acp(tmp_path) as acp, acp.connect() as client:
        tools.attach(client)
        source = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(source, "hello")
        forked = await client.call(
            "session/fork",
            {"sessionId": source, "cwd": str(project), "mcpServers": [acp_server()]},
        )
        sid = forked["sessionId"]
        assert sid != source
        assert [seen["_meta"]["maple.sessionId"] for seen in tools.seen] == [sid, sid]
        await client.prompt(sid, '/mcp page__echo {"text": "forked"}')
        assert only_row(client, sid)[1][-1]["status"] == "completed"
        client.validate(acp_schema)


async def test_a_real_mcp_server_behind_the_client(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with (
        SdkTools().running() as tools,
        running_acp(tmp_path) as acp,
        acp.connect() as client,
    ):
        tools.attach(client)
        sid = (await client.new_session(str(project), mcp_servers=[acp_server("sdk", "s")]))[
            "sessionId"
        ]
        await client.prompt(sid, '/mcp sdk__shout {"text": "quiet"}')
        _, updates = only_row(client, sid)
        assert updates[-1]["status"] == "completed"
        assert updates[-1]["rawOutput"]["content"] == [{"type": "text", "text": "QUIET"}]
        assert [seen["method"] for seen in tools.seen] == ["initialize", "tools/list", "tools/call"]
        client.validate(acp_schema)


async def test_a_server_that_speaks_only_the_stateless_revision_is_discovered(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    tools = ScriptedTools(stateless=True)
    async with running_acp(tmp_path) as acp, acp.connect() as client:
        tools.attach(client)
        sid = (await client.new_session(str(project), mcp_servers=[acp_server()]))["sessionId"]
        await client.prompt(sid, '/mcp page__echo {"text": "stateless"}')
        _, updates = only_row(client, sid)
        assert updates[-1]["status"] == "completed"
        assert [seen["method"] for seen in tools.seen] == [
            "initialize",
            "server/discover",
            "tools/list",
            "tools/call",
        ]
        # After discovery every request names the revision; the outer _meta is the host's.
        for seen in tools.seen[1:]:
            assert seen["params"]["_meta"][STATELESS_VERSION_KEY] == STATELESS_VERSION
            assert "maple.toolCallId" not in seen["params"]["_meta"]
        client.validate(acp_schema)


# -- failures ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
async def test_a_silent_client_fails_session_new_in_one_line_after_30_seconds(
    tmp_path: Path,
    project: Path,
    schemas: tuple[AcpSchema, AcpSchema],
    version: int,
    autojump_clock: trio.testing.MockClock,
) -> None:
    tools = ScriptedTools(silent=True)
    async with versioned(tmp_path, version, schemas) as (acp, client, schema):
        tools.attach(client)
        started = trio.current_time()
        with pytest.raises(ProtocolError) as refused:
            await client.new_session(str(project), mcp_servers=[acp_server()])
        assert trio.current_time() - started == pytest.approx(30.0, abs=1.0)
        assert refused.value.code == INVALID_PARAMS
        assert refused.value.message == (
            "MCP server #0 ('page'): did not connect and list its tools within 30 seconds"
        )
        # The abandoned request was withdrawn, and nothing of the session was kept.
        await withdrawn(client, tools, 1)
        assert acp.stored_task_ids() == []
        # The connection is still usable.
        assert (await client.new_session(str(project)))["sessionId"]
        client.validate(schema)


@pytest.mark.parametrize("version", [1, 2])
async def test_a_client_that_does_not_serve_mcp_message_fails_the_open_in_one_line(
    tmp_path: Path, project: Path, schemas: tuple[AcpSchema, AcpSchema], version: int
) -> None:
    async with versioned(tmp_path, version, schemas) as (acp, client, schema):
        with pytest.raises(ProtocolError) as refused:
            await client.new_session(str(project), mcp_servers=[acp_server()])
        assert refused.value.code == INVALID_PARAMS
        assert refused.value.message.startswith(
            "MCP server #0 ('page'): the client refused the MCP handshake (error -32603: "
            "the client failed it: -32601"
        )
        assert "\n" not in refused.value.message
        assert acp.stored_task_ids() == []
        client.validate(schema)


@pytest.mark.parametrize("version", [1, 2])
async def test_a_tool_call_the_client_never_answers_fails_after_30_seconds(
    tmp_path: Path,
    project: Path,
    schemas: tuple[AcpSchema, AcpSchema],
    version: int,
    autojump_clock: trio.testing.MockClock,
) -> None:
    tools = ScriptedTools()
    async with versioned(tmp_path, version, schemas) as (_, client, schema):
        tools.attach(client)
        sid = (await client.new_session(str(project), mcp_servers=[acp_server()]))["sessionId"]
        await run_prompt(client, sid, "/mcp page__hang {}", version)
        _, updates = only_row(client, sid)
        assert updates[-1]["status"] == "failed"
        assert shown(updates[-1]) == (
            "MCP server #0 ('page'): the tool call timed out after 30 seconds"
        )
        await withdrawn(client, tools, 1)
        # The session goes on.
        await run_prompt(client, sid, '/mcp page__echo {"text": "after"}', version)
        assert [rows[-1]["status"] for rows in tool_rows(client, sid).values()] == [
            "failed",
            "completed",
        ]
        client.validate(schema)


async def test_closing_the_session_withdraws_a_call_waiting_at_the_client(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    tools = ScriptedTools()
    async with running_acp(tmp_path) as acp, acp.connect() as client:
        tools.attach(client)
        sid = (await client.new_session(str(project), mcp_servers=[acp_server()]))["sessionId"]
        prompt_id = await client.send(
            "session/prompt",
            {"sessionId": sid, "prompt": [{"type": "text", "text": "/mcp page__hang {}"}]},
        )
        # Frames wake the waiter: the call's own frame is the one to wait for.
        await client.wait_until(lambda: bool(inner_requests(client, "tools/call")))
        with trio.fail_after(5):
            await client.close_session(sid)
            # The call's request is withdrawn (its handler at the client cancelled), and the
            # turn it belonged to ends.
            await withdrawn(client, tools, 1)
            await client.wait_until(lambda: client.answer(prompt_id) is not None)
        [request] = inner_requests(client, "tools/call")
        assert [cancel["requestId"] for cancel in cancels(client)] == [request["id"]]
        client.validate(acp_schema)


@pytest.mark.parametrize("version", [1, 2])
async def test_the_inner_error_is_passed_on(
    tmp_path: Path, project: Path, schemas: tuple[AcpSchema, AcpSchema], version: int
) -> None:
    tools = ScriptedTools()
    async with versioned(tmp_path, version, schemas) as (_, client, schema):
        tools.attach(client)
        sid = (await client.new_session(str(project), mcp_servers=[acp_server()]))["sessionId"]
        await run_prompt(client, sid, "/mcp page__broken {}", version)
        _, updates = only_row(client, sid)
        assert updates[-1]["status"] == "failed"
        assert shown(updates[-1]) == (
            "MCP server #0 ('page'): the server returned error -32000: the page went away"
        )
        client.validate(schema)


async def test_a_result_over_4_mib_is_refused_through_the_wire(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    """The client's answer is larger than a peer of this library would send at once (its own
    outbound bound), so this client writes its lines raw."""
    sent: list[Any] = []
    received: list[Any] = []
    async with running_acp(tmp_path) as acp, trio.open_nursery() as nursery:
        ours, theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(acp.acp.serve_stream, theirs)
        buffer = b""

        async def write(message: dict[str, Any]) -> None:
            sent.append(message)
            await ours.send_all(orjson.dumps(message) + b"\n")

        async def until(done: Any) -> Any:
            nonlocal buffer
            while True:
                while b"\n" not in buffer:
                    buffer += await ours.receive_some(1 << 20)
                line, buffer = buffer.split(b"\n", 1)
                message = orjson.loads(line)
                received.append(message)
                answer: Any = None
                if message.get("method") == "mcp/message":
                    answer = await tools.handle(message["params"])
                elif message.get("method") == "session/request_permission":
                    options = message["params"]["options"]
                    chosen = next(o for o in options if o["kind"] == "allow_once")["optionId"]
                    answer = {"outcome": {"outcome": "selected", "optionId": chosen}}
                if answer is not None:
                    await write({"jsonrpc": "2.0", "id": message["id"], "result": answer})
                if done(message):
                    return message

        def answers(msg_id: int) -> Any:
            return lambda m: m.get("id") == msg_id and "method" not in m

        tools = ScriptedTools()
        with trio.fail_after(30):
            init = {"protocolVersion": 1, "clientCapabilities": {}}
            await write({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})
            await until(answers(0))
            new = {"cwd": str(project), "mcpServers": [acp_server()]}
            await write({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": new})
            sid = (await until(answers(1)))["result"]["sessionId"]
            prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "/mcp page__big {}"}]}
            await write({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": prompt})
            assert (await until(answers(2)))["result"]["stopReason"] == "end_turn"
        await ours.aclose()
        nursery.cancel_scope.cancel()
    [big] = [m for m in sent if len(orjson.dumps(m)) > 4 * 1024 * 1024]
    assert big["result"]["result"]["content"][0]["text"] == "x" * BIG_TEXT_CHARS
    updates = [m["params"]["update"] for m in received if m.get("method") == "session/update"]
    final = [u for u in updates if u.get("sessionUpdate") == "tool_call_update"][-1]
    assert final["status"] == "failed"
    assert "the tool result is larger than 4194304 bytes" in shown(final)
    frames = [("out", m) for m in sent] + [("in", m) for m in received]
    assert validate_frames(acp_schema, frames) == len(received)


# -- definitions refused before any mcp/message ------------------------------------------------


BAD_DEFINITIONS = {
    "17 servers": (
        [acp_server(f"s{n}", f"id-{n}") for n in range(17)],
        "at most 16 MCP servers are allowed per session",
    ),
    "no serverId": ([{"type": "acp", "name": "page"}], "serverId"),
    "empty serverId": (
        [acp_server(server_id="")],
        "MCP server #0 ('page'): serverId must be a non-empty string",
    ),
    "empty name": ([acp_server(name="")], "MCP server #0: name must be 1 to 64 characters"),
    "repeated name": (
        [acp_server("page", "a"), acp_server("page", "b")],
        "MCP server #1 ('page'): name 'page' is not unique after normalisation",
    ),
    "repeated serverId": (
        [acp_server("one", "same"), acp_server("two", "same")],
        "MCP server #1 ('two'): serverId repeats the id of an earlier server",
    ),
}


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("case", sorted(BAD_DEFINITIONS))
async def test_bad_definitions_are_refused_before_any_mcp_message(
    tmp_path: Path,
    project: Path,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
    case: str,
    version: int,
) -> None:
    servers, expected = BAD_DEFINITIONS[case]
    schema = acp_schema if version == 1 else acp_schema_v2
    tools = ScriptedTools()
    async with (
        running_acp(tmp_path, config=BOTH_VERSIONS) as acp,
        acp.connect(initialize=False, schema=schema) as client,
    ):
        tools.attach(client)
        await initialize(client, version)
        with pytest.raises(ProtocolError) as refused:
            await client.new_session(str(project), mcp_servers=servers)
        assert refused.value.code == INVALID_PARAMS
        assert expected in refused.value.message
        assert "\n" not in refused.value.message
        assert tools.seen == []
        assert acp.stored_task_ids() == []
        client.validate(schema)


# -- nothing at rest ---------------------------------------------------------------------------


async def test_the_store_holds_no_server_id_nor_setup_params(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    server_id = "sid-9f2c1e7a5b3d4c6e8f0a1b2c3d4e5f60"
    tools = ScriptedTools()
    async with running_acp(tmp_path) as acp, acp.connect() as client:
        tools.attach(client)
        sid = (await client.new_session(str(project), mcp_servers=[acp_server("page", server_id)]))[
            "sessionId"
        ]
        await client.prompt(sid, '/mcp page__echo {"text": "stored as a row"}')
        stored = acp.store_bytes()
        assert sid.encode() in stored  # the session itself is kept ...
        assert server_id.encode() not in stored  # ... its client's server id never
        assert b"page-tools" not in stored  # nor what set-up learnt (the server's info)
        assert b"maple.sessionId" not in stored
        client.validate(acp_schema)
