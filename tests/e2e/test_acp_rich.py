"""Richer sessions through ``maple-acp serve`` and a real connector process, every frame the
agent sends checked against the ACP schema: images and embedded text resources in prompts
(declared, described, stored and replayed), and compactions (to clients that opted in, live
and replayed where they happened)."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from maple_acp.testing.client import AcpTestClient
from maple_acp.testing.images import image_block, png, text_resource_block
from maple_acp.testing.schema import AcpSchema
from maple_acp.wire import ProtocolError

from .host_processes import (
    DEADLINE,
    answer_index,
    assert_only_protocol_lines,
    connector_client,
    running_host,
)


async def test_an_image_and_a_resource_are_described_then_replayed_by_a_load(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    picture = png(3, 2)
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with connector_client(host.socket) as connector:
                client = connector.client
                init = await client.initialize()
                caps = init["agentCapabilities"]["promptCapabilities"]
                assert caps == {"image": True, "audio": False, "embeddedContext": True}
                sid = (await client.new_session(os.fspath(project)))["sessionId"]
                blocks = [
                    {"type": "text", "text": "what is in it?"},
                    image_block(picture),
                    text_resource_block("file:///notes.md", "# notes"),
                ]
                assert (await client.prompt(sid, blocks))["stopReason"] == "end_turn"
                assert client.text(sid) == (
                    f"image 1: image/png image, 3x2, {len(picture)} bytes\n"
                    "resource file:///notes.md: 7 bytes of text"
                    "what is in it?"
                )
                # A bad image on the same connection: refused, and the connection goes on.
                bad = [{"type": "image", "data": "%%%", "mimeType": "image/png"}]
                with pytest.raises(ProtocolError) as refused:
                    await client.prompt(sid, bad)
                assert refused.value.code == -32602
                assert "prompt[0]" in refused.value.message
                assert await client.close_session(sid) == {}
                client.validate(acp_schema)
                assert_only_protocol_lines(client)

            async with connector_client(host.socket) as connector:
                client = connector.client
                await client.initialize()
                await client.load_session(sid, os.fspath(project))
                loaded_at = answer_index(client, client.outbound()[-1]["id"])
                replayed = [
                    u["content"]
                    for u in client.updates(sid)
                    if u["sessionUpdate"] == "user_message_chunk"
                ]
                assert replayed == [
                    {
                        "type": "text",
                        "text": 'what is in it?\n\n<resource uri="file:///notes.md">\n# notes'
                        "\n</resource>",
                    },
                    {
                        "type": "image",
                        "data": base64.b64encode(picture).decode(),
                        "mimeType": "image/png",
                    },
                ]
                # The replay came before the load's answer.
                assert all(
                    i < loaded_at
                    for i, frame in enumerate(client.frames)
                    if frame.direction == "in"
                    and isinstance(frame.message, dict)
                    and frame.message.get("method") == "session/update"
                )
                client.validate(acp_schema)
                assert_only_protocol_lines(client)


#: A client that follows compactions says so with an empty object.
COMPACTION: dict[str, Any] = {"session": {"compaction": {}}}


def compaction_updates(client: AcpTestClient, sid: str) -> list[dict[str, Any]]:
    return [u for u in client.updates(sid) if u["sessionUpdate"].startswith("compaction_")]


async def test_compaction_reaches_only_a_client_that_opted_in_live_and_on_load(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with connector_client(host.socket) as connector:
                client = connector.client
                init_params = {"protocolVersion": 1, "clientCapabilities": COMPACTION}
                acp_schema.validate("InitializeRequest", init_params)
                await client.call("initialize", init_params)
                sid = (await client.new_session(os.fspath(project)))["sessionId"]
                await client.wait_until(
                    lambda: any(
                        c["name"] == "compact"
                        for u in client.updates(sid)
                        if u["sessionUpdate"] == "available_commands_update"
                        for c in u["availableCommands"]
                    )
                )
                await client.prompt(sid, "first words\nmore")
                await client.prompt(sid, "/compact fail")
                assert (await client.prompt(sid, "/compact"))["stopReason"] == "end_turn"
                updates = compaction_updates(client, sid)
                failed_id = updates[0]["compactionId"]
                assert [
                    u["status"]
                    for u in updates
                    if u["compactionId"] == failed_id and u["sessionUpdate"] == "compaction_update"
                ] == ["in_progress", "failed"]
                done = [u for u in updates if u["compactionId"] != failed_id]
                assert done[0] == {
                    "sessionUpdate": "compaction_update",
                    "compactionId": done[0]["compactionId"],
                    "status": "in_progress",
                }
                summary = "".join(
                    u["content"]["text"]
                    for u in done
                    if u["sessionUpdate"] == "compaction_summary_chunk"
                )
                assert summary.startswith("3 earlier messages.")
                assert "- user: first words" in summary
                assert done[-1]["status"] == "completed"
                # A compaction is not agent text.
                assert "earlier messages" not in client.text(sid)
                assert await client.close_session(sid) == {}
                client.validate(acp_schema)
                assert_only_protocol_lines(client)

            async with connector_client(host.socket) as connector:
                client = connector.client
                await client.call("initialize", init_params)
                await client.load_session(sid, os.fspath(project))
                [replayed] = compaction_updates(client, sid)
                assert replayed == {
                    "sessionUpdate": "compaction_update",
                    "compactionId": done[0]["compactionId"],
                    "status": "completed",
                    "summary": [{"type": "text", "text": summary}],
                }
                # Where it happened: after the /compact message that asked for it.
                kinds = [u["sessionUpdate"] for u in client.updates(sid)]
                assert kinds.index("compaction_update") > max(
                    i for i, kind in enumerate(kinds) if kind == "user_message_chunk"
                )
                await client.close_session(sid)
                client.validate(acp_schema)

            async with connector_client(host.socket) as connector:
                client = connector.client
                await client.initialize()
                await client.load_session(sid, os.fspath(project))
                await client.prompt(sid, "/compact")
                assert compaction_updates(client, sid) == []
                client.validate(acp_schema)
                assert_only_protocol_lines(client)
