"""What the conformance suite's v2 draft found about sessions: a list filtered by a directory
that does not exist lists nothing and a resume may name other additional directories (each
admitted like the cwd, kept by the session from then on), on v1 and v2 alike; on v2, an HTTP
MCP server's ``headers`` may be left out, a prompt's answer comes before every update of its
turn but the echo of its message, and a replay never adds to a message the client holds.
Every frame is checked against the schema of the connection's version."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from edge_harness import Harness, running_service

from maple_acp.edge import AcpServiceConfig
from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError

VERSIONS = pytest.mark.parametrize("version", [1, 2], ids=["v1", "v2"])

#: A real Streamable HTTP MCP server (tools ``echo``, ``add``, ``slow``), as its own process.
MCP_SERVER = Path(__file__).parents[1] / "soak" / "mcp_loopback.py"


@pytest.fixture(scope="module")
def mcp_port() -> Iterator[int]:
    process = subprocess.Popen([sys.executable, str(MCP_SERVER)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, "the loopback MCP server did not start"
        yield int(json.loads(line)["port"])
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
async def both(tmp_path: Path) -> AsyncIterator[Harness]:
    config = AcpServiceConfig(protocol_max=2)
    async with running_service(tmp_path, config=config) as running:
        yield running


@asynccontextmanager
async def connected(harness: Harness, version: int) -> AsyncIterator[AcpTestClient]:
    async with harness.connect() as client:
        if version == 1:
            await client.initialize()
        else:
            answer = await client.call(
                "initialize",
                {"protocolVersion": 2, "info": {"name": "t", "version": "0"}, "capabilities": {}},
            )
            assert answer["protocolVersion"] == 2
        yield client


def schema_of(version: int, v1: AcpSchema, v2: AcpSchema) -> AcpSchema:
    return v1 if version == 1 else v2


async def new_session(client: AcpTestClient, cwd: Path, **params: Any) -> str:
    answer = await client.call("session/new", {"cwd": str(cwd), "mcpServers": [], **params})
    return str(answer["sessionId"])


async def resume(client: AcpTestClient, sid: str, cwd: Path, directories: list[Path]) -> Any:
    return await client.call(
        "session/resume",
        {
            "sessionId": sid,
            "cwd": str(cwd),
            "mcpServers": [],
            "additionalDirectories": [str(d) for d in directories],
        },
    )


def write(path: Path, text: str) -> str:
    return "/tool write_file " + json.dumps({"path": str(path), "content": text})


async def prompted(client: AcpTestClient, sid: str, text: str, version: int) -> None:
    await client.prompt(sid, text)
    if version == 2:
        # v2 answers on acceptance: the turn ends with its idle state.
        await client.wait_until(
            lambda: any(
                u["sessionUpdate"] == "state_update" and u["state"] == "idle"
                for u in client.updates(sid)[-1:]
            )
        )


async def listed(client: AcpTestClient, **params: Any) -> list[dict[str, Any]]:
    return list((await client.list_sessions(**params))["sessions"])


@VERSIONS
async def test_a_list_filtered_by_a_directory_that_does_not_exist_lists_nothing(
    both: Harness,
    project: Path,
    tmp_path: Path,
    version: int,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
) -> None:
    async with connected(both, version) as client:
        sid = await new_session(client, project)
        await prompted(client, sid, "/echo kept", version)
        assert [s["sessionId"] for s in await listed(client, cwd=str(project))] == [sid]
        for missing in (project / "no-session-here", tmp_path / "gone" / "deeper"):
            assert await listed(client, cwd=str(missing)) == []
        # A file is no directory either: nothing is listed under it.
        (project / "a-file").write_text("x")
        assert await listed(client, cwd=str(project / "a-file")) == []
        # A relative path is still bad params, and the connection goes on.
        with pytest.raises(ProtocolError) as refused:
            await listed(client, cwd="relative/dir")
        assert refused.value.code == -32602
        assert [s["sessionId"] for s in await listed(client)] == [sid]
        client.validate(schema_of(version, acp_schema, acp_schema_v2))


async def test_outside_the_roots_a_missing_directory_lists_nothing_an_existing_one_is_refused(
    tmp_path: Path, project: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    config = AcpServiceConfig(allowed_roots=(str(project),))
    async with running_service(tmp_path, config=config) as harness, harness.connect() as client:
        await client.initialize()
        assert await listed(client, cwd=str(outside / "missing")) == []
        with pytest.raises(ProtocolError) as refused:
            await listed(client, cwd=str(outside))
        assert refused.value.code == -32602
        assert "outside the allowed roots" in refused.value.message


@VERSIONS
async def test_a_resume_names_the_sessions_new_additional_directories(
    both: Harness,
    project: Path,
    tmp_path: Path,
    version: int,
    acp_schema: AcpSchema,
    acp_schema_v2: AcpSchema,
) -> None:
    first, second, third = (tmp_path / name for name in ("first", "second", "third"))
    for directory in (first, second, third):
        directory.mkdir()
    schema = schema_of(version, acp_schema, acp_schema_v2)
    async with connected(both, version) as client:
        sid = await new_session(client, project, additionalDirectories=[str(first)])
        await prompted(client, sid, write(first / "one.txt", "one"), version)
        assert (first / "one.txt").read_text() == "one"
        client.validate(schema)
    async with connected(both, version) as client:
        # Another connection resumes with another set: admitted, and the session's from now on.
        assert "configOptions" in await resume(client, sid, project, [second])
        [row] = await listed(client)
        assert row["additionalDirectories"] == [str(second)]
        await prompted(client, sid, write(second / "two.txt", "two"), version)
        assert (second / "two.txt").read_text() == "two"
        # The directory it dropped is no longer the session's: the write fails its row.
        await prompted(client, sid, write(first / "late.txt", "late"), version)
        assert not (first / "late.txt").exists()
        # A re-attach on the same connection may change the set again.
        await resume(client, sid, project, [third, second])
        [row] = await listed(client)
        assert sorted(row["additionalDirectories"]) == sorted([str(third), str(second)])
        client.validate(schema)
    async with connected(both, version) as client:
        # Naming none activates none.
        await resume(client, sid, project, [])
        [row] = await listed(client)
        assert "additionalDirectories" not in row
        client.validate(schema)


async def test_a_resumed_directory_is_admitted_like_the_cwd(
    tmp_path: Path, project: Path, acp_schema: AcpSchema
) -> None:
    inside = project / "inside"
    inside.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    config = AcpServiceConfig(allowed_roots=(str(project),))
    async with running_service(tmp_path, config=config) as harness:
        async with harness.connect() as client:
            await client.initialize()
            sid = await new_session(client, project, additionalDirectories=[str(inside)])
            await client.prompt(sid, "/echo kept")
            for bad in ([outside], [tmp_path / "missing"]):
                with pytest.raises(ProtocolError) as refused:
                    await resume(client, sid, project, bad)
                assert refused.value.code == -32602
            with pytest.raises(ProtocolError) as relative:
                await client.call(
                    "session/resume",
                    {"sessionId": sid, "cwd": str(project), "additionalDirectories": ["rel"]},
                )
            assert relative.value.code == -32602
            [row] = await listed(client)
            assert row["additionalDirectories"] == [str(inside)]
            client.validate(acp_schema)
        async with harness.connect() as client:
            await client.initialize()
            with pytest.raises(ProtocolError) as refused:
                await resume(client, sid, project, [outside])
            assert refused.value.code == -32602
            # Nothing was attached or stored; a good resume then goes through.
            [row] = await listed(client)
            assert row["additionalDirectories"] == [str(inside)]
            await resume(client, sid, project, [])
            # A load still names the session's set.
            await client.close_session(sid)
            with pytest.raises(ProtocolError) as load:
                await client.call(
                    "session/load",
                    {
                        "sessionId": sid,
                        "cwd": str(project),
                        "mcpServers": [],
                        "additionalDirectories": [str(inside)],
                    },
                )
            assert load.value.code == -32602
            client.validate(acp_schema)


async def test_an_http_mcp_server_without_headers_is_served_on_v2_only(
    both: Harness, project: Path, mcp_port: int, acp_schema: AcpSchema, acp_schema_v2: AcpSchema
) -> None:
    server = {"type": "http", "name": "loop", "url": f"http://127.0.0.1:{mcp_port}/mcp"}
    async with connected(both, 2) as client:
        sid = await new_session(client, project, mcpServers=[server])
        await prompted(client, sid, '/mcp loop__echo {"text": "no headers needed"}', 2)
        [row] = [u for u in client.updates(sid) if u["sessionUpdate"] == "tool_call_update"][-1:]
        assert row["status"] == "completed"
        assert "no headers needed" in json.dumps(row)
        # A resume names its servers the same way.
        await client.close_session(sid)
        await client.call(
            "session/resume", {"sessionId": sid, "cwd": str(project), "mcpServers": [server]}
        )
        client.validate(acp_schema_v2)
    async with connected(both, 1) as client:
        # v1's schema requires them: still bad params there, naming the field.
        with pytest.raises(ProtocolError) as refused:
            await new_session(client, project, mcpServers=[server])
        assert refused.value.code == -32602
        assert "headers" in refused.value.message
        await new_session(client, project, mcpServers=[{**server, "headers": []}])
        client.validate(acp_schema)


def turn_order(client: AcpTestClient, sid: str, request_id: int) -> list[str]:
    """What arrived for one prompt, in order: ``answer``, or each update's kind (the user
    message's echo as ``echo``), from the prompt request on, up to the turn's idle state."""
    seen: list[str] = []
    started = False
    message_id = None
    for frame in client.frames:
        message = frame.message
        if frame.direction == "out":
            started |= isinstance(message, dict) and message.get("id") == request_id
            continue
        if not started or not isinstance(message, dict):
            continue
        if message.get("id") == request_id:
            seen.append("answer")
            message_id = message["result"]["messageId"]
            continue
        update = message.get("params", {}).get("update")
        if message.get("method") != "session/update" or message["params"]["sessionId"] != sid:
            continue
        kind = update["sessionUpdate"]
        # Before the answer the message id is not known yet: any user message is the echo.
        echo = kind.startswith("user_message") and message_id in (None, update["messageId"])
        seen.append("echo" if echo else kind)
        if kind == "state_update" and update["state"] == "idle":
            break
    return seen


async def test_a_v2_prompt_is_answered_before_any_update_of_its_turn_but_the_echo(
    both: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    async with connected(both, 2) as client:
        sid = await new_session(client, project)
        first_ids: list[int] = []
        for n in range(30):
            before = {id(f) for f in client.frames}
            await prompted(client, sid, f"/think step {n}\n/echo answer {n}\n/plan one", 2)
            [request] = [
                f.message
                for f in client.frames
                if id(f) not in before and f.direction == "out"
                if isinstance(f.message, dict) and f.message.get("method") == "session/prompt"
            ]
            first_ids.append(request["id"])
        for request_id in first_ids:
            order = turn_order(client, sid, request_id)
            assert order[0] in ("echo", "answer"), order
            answer_at = order.index("answer")
            assert set(order[:answer_at]) <= {"echo"}, order
            assert order[-1] == "state_update", order
            assert "agent_message_chunk" in order
            assert "agent_thought_chunk" in order
        client.validate(acp_schema_v2)


def as_held(client: AcpTestClient, sid: str) -> list[tuple[str, str]]:
    return [(kind, text) for kind, _, text in client.messages(sid)]


async def test_a_v2_replay_replaces_the_messages_a_client_holds(
    both: Harness, project: Path, acp_schema_v2: AcpSchema
) -> None:
    long = "y" * 40_000
    expected = [
        ("user_message", "/think pondering\n/echo short"),
        ("agent_thought", "pondering"),
        ("agent_message", "short"),
        ("user_message", long),
        ("agent_message", long),
    ]
    start = {"type": "start"}
    async with connected(both, 2) as client:
        sid = await new_session(client, project)
        await prompted(client, sid, "/think pondering\n/echo short", 2)
        await prompted(client, sid, long, 2)
        assert as_held(client, sid) == expected
        # The same client, holding every message, replays the session twice: nothing doubles.
        for _ in range(2):
            await client.call(
                "session/resume", {"sessionId": sid, "cwd": str(project), "replayFrom": start}
            )
            assert as_held(client, sid) == expected
        client.validate(acp_schema_v2)
    async with connected(both, 2) as client:
        await client.call(
            "session/resume", {"sessionId": sid, "cwd": str(project), "replayFrom": start}
        )
        replayed = client.updates(sid)
        assert as_held(client, sid) == expected
        # Short messages come whole; the long ones as a primer emptying the message, then
        # chunks (every chunk after its message's primer).
        whole = [u for u in replayed if u["sessionUpdate"] in dict(expected)]
        assert [len(u["content"]) for u in whole] == [1, 1, 1, 0, 0]
        primed: set[str] = set()
        for update in replayed:
            kind = update["sessionUpdate"]
            if kind.endswith("_message") and update["content"] == []:
                primed.add(update["messageId"])
            elif kind.endswith("_chunk"):
                assert update["messageId"] in primed, update
        client.validate(acp_schema_v2)
