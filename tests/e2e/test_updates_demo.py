"""Each kind of ``session/update`` a backend can produce, from the demo backend through
``maple-acp serve`` and a real connector process, every frame checked against the ACP schema."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from maple_acp.backends.demo import DEMO_COMMANDS
from maple_acp.testing.client import AcpTestClient, PermissionPolicy, allow
from maple_acp.testing.schema import AcpSchema

from .conftest import DEADLINE, connector_client, running_host


@asynccontextmanager
async def demo_session(
    directory: Path, project: Path, schema: AcpSchema, *, permission: PermissionPolicy = allow
) -> AsyncIterator[tuple[AcpTestClient, str]]:
    """A fresh host, one connector, one new session; every frame is validated at the end."""
    with trio.fail_after(DEADLINE):
        async with (
            running_host(directory) as host,
            connector_client(host.socket, permission=permission) as connector,
        ):
            client = connector.client
            await client.initialize()
            session_id = (await client.new_session(os.fspath(project)))["sessionId"]
            yield client, session_id
            client.validate(schema)


def of_kind(client: AcpTestClient, session_id: str, kind: str) -> list[dict[str, Any]]:
    return [u for u in client.updates(session_id) if u["sessionUpdate"] == kind]


def last_tool_row(client: AcpTestClient, session_id: str) -> dict[str, Any]:
    return [u for u in client.updates(session_id) if "toolCallId" in u][-1]


def titles(client: AcpTestClient, session_id: str) -> list[dict[str, Any]]:
    return [u for u in of_kind(client, session_id, "session_info_update") if "title" in u]


def write_file(path: str, content: str) -> str:
    return "/tool write_file " + json.dumps({"path": path, "content": content})


async def test_plan_sends_the_whole_list_with_each_status(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with demo_session(short_dir, project, acp_schema) as (client, sid):
        script = (
            "/plan [x] read the code; [>] write the fix; run the tests\n/plan [x] all; [x] done"
        )
        answer = await client.prompt(sid, script)
        assert answer["stopReason"] == "end_turn"
        plans = of_kind(client, sid, "plan")
        assert plans[0]["entries"] == [
            {"content": "read the code", "priority": "medium", "status": "completed"},
            {"content": "write the fix", "priority": "medium", "status": "in_progress"},
            {"content": "run the tests", "priority": "medium", "status": "pending"},
        ]
        # The whole list each time: the second plan replaces the first.
        assert [e["content"] for e in plans[1]["entries"]] == ["all", "done"]
        assert len(plans) == 2


async def test_context_reports_usage_update(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with demo_session(short_dir, project, acp_schema) as (client, sid):
        answer = await client.prompt(sid, "/context 1200 8000\n/context 9000 8000")
        assert answer["stopReason"] == "end_turn"
        usage = of_kind(client, sid, "usage_update")
        assert [(u["used"], u["size"]) for u in usage] == [(1200, 8000), (9000, 8000)]
        # Context usage only: no invented cost.
        assert all("cost" not in u or u["cost"] is None for u in usage)


async def test_available_commands_follow_the_new_session_answer(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with demo_session(short_dir, project, acp_schema) as (client, sid):
        await client.wait_until(lambda: bool(of_kind(client, sid, "available_commands_update")))
        [update] = of_kind(client, sid, "available_commands_update")
        commands = {c["name"]: c for c in update["availableCommands"]}
        assert list(commands) == [c.name for c in DEMO_COMMANDS]
        assert commands["plan"]["input"] == {"hint": "[x] STEP; [>] STEP; STEP"}
        assert "input" not in commands["hang"] or commands["hang"]["input"] is None
        assert all(c["description"] and "\n" not in c["description"] for c in commands.values())


async def test_a_slash_prompt_reaches_the_backend_unchanged(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with demo_session(short_dir, project, acp_schema) as (client, sid):
        # The demo names the directive it received: the edge neither ran nor rewrote it.
        answer = await client.prompt(sid, "/no_such_directive  with  spaces")
        assert answer["stopReason"] == "end_turn"
        text = client.text(sid)
        assert "/no_such_directive" in text
        assert "/plan" in text
        assert "/tool" in text
        # A known one runs with its argument exactly as typed (inner spacing included).
        await client.prompt(sid, "/echo   keep   these  spaces")
        last = of_kind(client, sid, "agent_message_chunk")[-1]
        assert last["content"]["text"] == "keep   these  spaces"


async def test_write_file_carries_a_diff_and_the_location(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    (project / "notes.txt").write_text("old line\n")
    async with demo_session(short_dir, project, acp_schema) as (client, sid):
        answer = await client.prompt(sid, write_file("notes.txt", "new line\n"))
        assert answer["stopReason"] == "end_turn"
        assert (project / "notes.txt").read_text() == "new line\n"
        target = os.fspath((project / "notes.txt").resolve())
        [request] = client.permission_requests
        assert request["toolCall"]["title"] == "write_file: notes.txt"
        rows = [u for u in client.updates(sid) if u["sessionUpdate"].startswith("tool_call")]
        final = rows[-1]
        assert final["status"] == "completed"
        diffs = [c for c in final["content"] if c["type"] == "diff"]
        assert diffs == [
            {"type": "diff", "path": target, "oldText": "old line\n", "newText": "new line\n"}
        ]
        # The location points at the first changed line.
        assert final["locations"] == [{"path": target, "line": 1}]
        # A new file: no old text, said with an explicit null (Toad shows no diff without it).
        await client.prompt(sid, write_file("sub/new.txt", "fresh"))
        assert (project / "sub" / "new.txt").read_text() == "fresh"
        final = last_tool_row(client, sid)
        [diff] = [c for c in final["content"] if c["type"] == "diff"]
        assert diff["newText"] == "fresh"
        assert "oldText" in diff
        assert diff["oldText"] is None


async def test_write_file_denied_or_escaping_the_root_fails_its_row_only(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    outside = short_dir / "outside.txt"

    def reject_all(params: Mapping[str, Any]) -> str:
        return "reject"

    async with demo_session(short_dir, project, acp_schema, permission=reject_all) as (
        client,
        sid,
    ):
        answer = await client.prompt(sid, write_file("denied.txt", "no"))
        assert answer["stopReason"] == "end_turn"
        assert last_tool_row(client, sid)["status"] == "failed"
        assert not (project / "denied.txt").exists()
        assert len(client.permission_requests) == 1

        for escape in ("../outside.txt", os.fspath(outside)):
            answer = await client.prompt(sid, write_file(escape, "no"))
            assert answer["stopReason"] == "end_turn"
            final = last_tool_row(client, sid)
            assert final["status"] == "failed"
            assert not outside.exists()
        # Nothing was asked for a path outside the root.
        assert len(client.permission_requests) == 1
        await client.prompt(sid, "/echo still here")
        assert client.text(sid).endswith("still here")


async def test_first_prompt_titles_the_session_and_the_list_shows_it(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with demo_session(short_dir, project, acp_schema) as (client, sid):
        await client.prompt(sid, "\n  Fix the login page  \nwith more lines below")
        [info] = titles(client, sid)
        assert info["title"] == "Fix the login page"
        listing = await client.list_sessions(cwd=os.fspath(project))
        assert [s.get("title") for s in listing["sessions"]] == ["Fix the login page"]
        # Only the first prompt names it.
        await client.prompt(sid, "another prompt")
        assert len(titles(client, sid)) == 1


async def test_a_backend_title_wins_over_the_automatic_one(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with demo_session(short_dir, project, acp_schema) as (client, sid):
        await client.prompt(sid, "first line of the prompt\n/title Chosen by the engine")
        assert [u["title"] for u in titles(client, sid)] == ["Chosen by the engine"]
        listing = await client.list_sessions(cwd=os.fspath(project))
        assert [s.get("title") for s in listing["sessions"]] == ["Chosen by the engine"]


async def test_fail_shows_its_message_then_ends_the_turn(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    async with demo_session(short_dir, project, acp_schema) as (client, sid):
        answer = await client.prompt(sid, "/echo before\n/fail the engine gave up\n/echo after")
        # What the README promises a client sees: the text before, the message, end_turn.
        assert answer["stopReason"] == "end_turn"
        chunks = of_kind(client, sid, "agent_message_chunk")
        assert [c["content"]["text"] for c in chunks] == ["before", "the engine gave up"]
        assert chunks[0]["messageId"] != chunks[1]["messageId"]
