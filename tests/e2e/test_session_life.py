"""A whole session life through ``maple-acp serve`` and real connector processes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError

from .host_processes import DEADLINE, assert_only_protocol_lines, connector_client, running_host


def _kinds(updates: list[dict[str, Any]]) -> list[str]:
    return [u["sessionUpdate"] for u in updates]


async def test_full_session_life(short_dir: Path, project: Path, acp_schema: AcpSchema) -> None:
    decisions: list[str] = []

    def permission(params: Mapping[str, Any]) -> str:
        return decisions.pop(0)

    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with connector_client(host.socket, permission=permission) as first:
                client = first.client
                init = await client.initialize()
                assert init["protocolVersion"] == 1
                assert init["agentCapabilities"]["loadSession"] is True
                session_id = (await client.new_session(os.fspath(project)))["sessionId"]

                # A streamed reply: many chunks of one message, a thought, usage of this turn.
                answer = await client.prompt(
                    session_id, "/think planning\nhello there\n/stream 50 10\n/usage 3 4"
                )
                assert answer["stopReason"] == "end_turn"
                assert answer["usage"]["inputTokens"] == 3
                assert client.text(session_id) == "hello there" + "x" * 500
                assert client.text(session_id, "agent_thought_chunk") == "planning"
                chunks = [
                    u
                    for u in client.updates(session_id)
                    if u["sessionUpdate"] == "agent_message_chunk"
                ]
                # Chunks queued together arrive joined: at most as many frames as were sent.
                assert 2 <= len(chunks) <= 51
                assert chunks[0]["content"]["text"] == "hello there"
                assert len({c["messageId"] for c in chunks[1:]}) == 1

                # A tool allowed: the command really runs on the host.
                decisions.append("allow")
                before = len(client.updates(session_id))
                answer = await client.prompt(session_id, '/tool shell {"command": "echo hi"}')
                assert answer["stopReason"] == "end_turn"
                rows = client.updates(session_id)[before:]
                assert _kinds(rows)[0] == "tool_call"
                assert rows[-1]["status"] == "completed"
                assert "hi" in rows[-1]["content"][0]["content"]["text"]
                request = client.permission_requests[-1]
                assert [o["kind"] for o in request["options"]] == ["allow_once", "reject_once"]

                # A tool rejected: it never runs and ends failed.
                decisions.append("reject")
                marker = project / "must-not-exist"
                before = len(client.updates(session_id))
                answer = await client.prompt(
                    session_id, f'/tool shell {{"command": "touch {marker}"}}'
                )
                assert answer["stopReason"] == "end_turn"
                rows = client.updates(session_id)[before:]
                assert rows[-1]["status"] == "failed"
                assert not marker.exists()
                assert len(client.permission_requests) == 2

                # A prompt that hangs until cancelled.
                result: dict[str, Any] = {}

                async def hang() -> None:
                    result.update(await client.prompt(session_id, "/echo waiting\n/hang"))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(hang)
                    await client.wait_until(lambda: client.text(session_id).endswith("waiting"))
                    await client.cancel(session_id)
                assert result["stopReason"] == "cancelled"

                listing = await client.list_sessions(cwd=os.fspath(project))
                assert [s["sessionId"] for s in listing["sessions"]] == [session_id]

                assert await client.close_session(session_id) == {}
                # Every frame of the session (the streamed chunks may have arrived joined).
                assert client.validate(acp_schema) >= 20
                assert_only_protocol_lines(client)
            assert first.process.returncode == 0
            assert first.stderr.lines == []

            # Another process loads the session: history is replayed before the answer.
            async with connector_client(host.socket) as second:
                client = second.client
                await client.initialize()
                await client.load_session(session_id, os.fspath(project))
                replay = client.updates(session_id)
                response_index = next(
                    i
                    for i, frame in enumerate(client.frames)
                    if frame.direction == "in"
                    and isinstance(frame.message, dict)
                    and frame.message.get("id") == 2
                )
                updates = [
                    (i, frame.message["params"]["update"]["sessionUpdate"])
                    for i, frame in enumerate(client.frames)
                    if frame.direction == "in"
                    and isinstance(frame.message, dict)
                    and frame.message.get("method") == "session/update"
                ]
                # Every replayed update and the commands come before the answer.
                assert max(i for i, _ in updates) < response_index
                assert "available_commands_update" in [kind for _, kind in updates]
                kinds = _kinds(replay)
                assert kinds.count("user_message_chunk") == 4
                assert "agent_thought_chunk" in kinds
                assert "tool_call" in kinds
                assert client.text(session_id).startswith("hello there")
                answer = await client.prompt(session_id, "/echo again")
                assert answer["stopReason"] == "end_turn"
                assert await client.close_session(session_id) == {}
                client.validate(acp_schema)
                assert_only_protocol_lines(client)
            assert second.process.returncode == 0

            status = await host.status()
            assert status["leases"] == 0
            assert status["activeRuns"] == 0


async def test_relayed_environment_reaches_the_shell_tool_only_when_allowed(
    short_dir: Path, project: Path
) -> None:
    # OTHER is in the connector's environment but not in its relay list: it stays behind.
    relay = {"MAPLE_ACP_RELAY_ENV": "RELAY_TOKEN", "RELAY_TOKEN": "t0k", "OTHER": "no"}
    command = '/tool shell {"command": "printf \'%s|%s\' \\"$RELAY_TOKEN\\" \\"$OTHER\\""}'
    with trio.fail_after(DEADLINE):
        async with (
            running_host(short_dir, "--relay-allow", "RELAY_TOKEN") as host,
            connector_client(host.socket, env=relay) as connector,
        ):
            client = connector.client
            await client.initialize()
            session_id = (await client.new_session(os.fspath(project)))["sessionId"]
            await client.prompt(session_id, command)
            rows = [
                u
                for u in client.updates(session_id)
                if u["sessionUpdate"] in ("tool_call", "tool_call_update")
            ]
            final = rows[-1]
            assert final["status"] == "completed"
            # Only the relayed name arrived; the host never had either in its own environment.
            assert final["content"][0]["content"]["text"] == "t0k|"


async def test_a_new_session_survives_a_disconnect_for_the_grace_period(
    short_dir: Path, project: Path
) -> None:
    # Clients such as acpx create a session in one process and prompt it from the next.
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with connector_client(host.socket) as first:
                await first.client.initialize()
                session_id = (await first.client.new_session(os.fspath(project)))["sessionId"]
            async with connector_client(host.socket) as second:
                await second.client.initialize()
                # Still provisional: hidden from the list, loadable by id.
                assert (await second.client.list_sessions())["sessions"] == []
                await second.client.load_session(session_id, os.fspath(project))
                answer = await second.client.prompt(session_id, "/echo later")
                assert answer["stopReason"] == "end_turn"
                assert second.client.text(session_id) == "later"


async def test_grace_zero_deletes_a_never_prompted_session_on_disconnect(
    short_dir: Path, project: Path
) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir, "--grace", "0") as host:
            async with connector_client(host.socket) as first:
                await first.client.initialize()
                session_id = (await first.client.new_session(os.fspath(project)))["sessionId"]
            await host.wait_status(lambda status: status["leases"] == 0)
            async with connector_client(host.socket) as second:
                await second.client.initialize()
                with pytest.raises(ProtocolError) as refused:
                    await second.client.load_session(session_id, os.fspath(project))
                assert refused.value.code == -32002


async def test_allowed_roots_decide_where_sessions_may_open(short_dir: Path) -> None:
    allowed = short_dir / "allowed"
    inside = allowed / "repo"
    outside = short_dir / "elsewhere"
    inside.mkdir(parents=True)
    outside.mkdir()
    with trio.fail_after(DEADLINE):
        async with (
            running_host(short_dir, "--allowed-root", os.fspath(allowed)) as host,
            connector_client(host.socket) as connector,
        ):
            client = connector.client
            with pytest.raises(ProtocolError) as refused:
                await client.new_session(os.fspath(outside))
            assert refused.value.code == -32602
            sid = (await client.new_session(os.fspath(inside)))["sessionId"]
            assert (await client.prompt(sid, "/echo inside"))["stopReason"] == "end_turn"
            listed = await client.list_sessions()
            assert [s["sessionId"] for s in listed["sessions"]] == [sid]
