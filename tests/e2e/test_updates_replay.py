"""After a reload (``session/load`` from a new connector process) a client gets back the
latest plan, the file diffs with their locations and the title, before the load's answer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import trio

from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.schema import AcpSchema

from .conftest import DEADLINE, assert_only_protocol_lines, connector_client, running_host
from .host_processes import answer_index, updates_after

COMMANDS = "available_commands_update"
#: An agent message longer than one update carries (19,999 characters).
LONG = " ".join(["long"] * 4_000)


def of_kind(updates: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [u for u in updates if u["sessionUpdate"] == kind]


def titles(updates: list[dict[str, Any]]) -> list[str]:
    return [u["title"] for u in of_kind(updates, "session_info_update") if "title" in u]


def update_indexes(client: AcpTestClient, kind: str) -> list[int]:
    return [
        i
        for i, frame in enumerate(client.frames)
        if frame.direction == "in"
        and isinstance(frame.message, dict)
        and frame.message.get("method") == "session/update"
        and frame.message["params"]["update"]["sessionUpdate"] == kind
    ]


async def test_reload_replays_the_plan_diffs_and_title(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    write = "/tool write_file " + json.dumps({"path": "src/app.py", "content": "print('hi')\n"})
    target = os.fspath((project / "src" / "app.py").resolve())
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with connector_client(host.socket) as first:
                client = first.client
                await client.initialize()
                sid = (await client.new_session(os.fspath(project)))["sessionId"]
                await client.prompt(sid, "Write the app\n/plan [>] write it; test it")
                await client.prompt(sid, write)
                await client.prompt(sid, "/plan [x] write it; [>] test it\n/context 10 100")
                live = client.updates(sid)
                # Every live tool row carries the tool's stable name, the first and the updates.
                rows = [u for u in live if u["sessionUpdate"] in ("tool_call", "tool_call_update")]
                assert len(rows) >= 2
                assert {u.get("name") for u in rows} == {"write_file"}
                assert [u for u in of_kind(live, "session_info_update") if "title" in u][-1][
                    "title"
                ] == "Write the app"
                assert await client.close_session(sid) == {}
                client.validate(acp_schema)

            async with connector_client(host.socket) as second:
                client = second.client
                await client.initialize()
                await client.load_session(sid, os.fspath(project))
                replay = client.updates(sid)

                # Only the latest plan, whole.
                [plan] = of_kind(replay, "plan")
                assert plan["entries"] == [
                    {"content": "write it", "priority": "medium", "status": "completed"},
                    {"content": "test it", "priority": "medium", "status": "in_progress"},
                ]
                # The write, with its terminal state, diff and location.
                calls = [u for u in replay if u["sessionUpdate"] == "tool_call"]
                [call] = calls
                assert call["status"] == "completed"
                assert call["name"] == "write_file"
                [diff] = [c for c in call["content"] if c["type"] == "diff"]
                assert diff["path"] == target
                assert diff["newText"] == "print('hi')\n"
                assert diff.get("oldText") is None
                assert [loc["path"] for loc in call["locations"]] == [target]
                # The title, and no context usage (it is not history).
                assert [
                    u["title"] for u in of_kind(replay, "session_info_update") if "title" in u
                ] == ["Write the app"]
                assert of_kind(replay, "usage_update") == []

                # All of it came before the load's answer (request id 2), the commands too;
                # nothing for the session follows the answer (a request that round-trips,
                # request id 3, proves whatever the attach caused was already sent).
                loaded_at = answer_index(client, 2)
                for kind in ("plan", "tool_call", "session_info_update", COMMANDS):
                    assert update_indexes(client, kind), kind
                    assert all(i < loaded_at for i in update_indexes(client, kind)), kind
                await client.list_sessions()
                assert updates_after(client, sid, loaded_at) == []

                assert await client.close_session(sid) == {}
                client.validate(acp_schema)
                assert_only_protocol_lines(client)

            # A resume replays nothing; its commands come before its answer too.
            async with connector_client(host.socket) as third:
                client = third.client
                await client.initialize()
                await client.call(
                    "session/resume",
                    {"sessionId": sid, "cwd": os.fspath(project), "mcpServers": []},
                )
                await client.list_sessions()
                kinds = [u["sessionUpdate"] for u in client.updates(sid)]
                assert "plan" not in kinds
                assert "tool_call" not in kinds
                assert update_indexes(client, COMMANDS)[0] < answer_index(client, 2)
                assert updates_after(client, sid, answer_index(client, 2)) == []
                client.validate(acp_schema)


async def test_the_first_load_after_a_restart_replays_what_a_warm_load_does(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    # The host answers a load from its history cache while it holds the task, and from the
    # message rows' three columns after a restart: the client must not tell them apart.
    write = "/tool write_file " + json.dumps({"path": "notes.txt", "content": "one\n"})
    script = "\n".join(
        [
            'Plain "quoted" text \\ with a tab\t and é',
            "/think thinking it over",
            "/echo " + LONG,  # replayed in pieces
            "/plan first; [x] second",
            write,
            "/echo after the tool",
        ]
    )

    async def replayed(host_socket: Path, sid: str) -> list[dict[str, Any]]:
        async with connector_client(host_socket) as connector:
            client = connector.client
            await client.initialize()
            await client.load_session(sid, os.fspath(project))
            # What came before the answer: the history, the title.
            loaded_at = answer_index(client, 2)
            before = [
                frame.message["params"]["update"]
                for frame in client.frames[:loaded_at]
                if frame.direction == "in"
                and isinstance(frame.message, dict)
                and frame.message.get("method") == "session/update"
            ]
            assert await client.close_session(sid) == {}
            client.validate(acp_schema)
            assert_only_protocol_lines(client)
            return before

    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with connector_client(host.socket) as first:
                client = first.client
                await client.initialize()
                sid = (await client.new_session(os.fspath(project)))["sessionId"]
                await client.prompt(sid, script)
                await client.prompt(sid, "/echo second turn")
                assert await client.close_session(sid) == {}
            warm = await replayed(host.socket, sid)
        async with running_host(short_dir) as host:
            cold = await replayed(host.socket, sid)
    assert cold == warm
    kinds = [u["sessionUpdate"] for u in cold]
    assert kinds.count("user_message_chunk") == 3  # the long prompt in two pieces, then one
    assert kinds.count("agent_thought_chunk") == 1
    assert kinds.count("plan") == 1
    assert kinds.count("tool_call") == 1
    texts = [u["content"]["text"] for u in cold if u["sessionUpdate"] == "agent_message_chunk"]
    assert texts[0] == 'Plain "quoted" text \\ with a tab\t and é'
    assert "".join(texts[1:-2]) == LONG
    assert len(texts[1:-2]) == 2
    assert texts[-2:] == ["after the tool", "second turn"]
