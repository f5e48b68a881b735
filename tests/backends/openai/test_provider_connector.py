"""End to end: an ACP client -> a real ``maple-acp-connector`` subprocess -> ``maple-acp serve
--provider-url ...`` (a subprocess) -> the loopback OpenAI-compatible server in this test.

Covers the conversation a user would have: a streamed answer, a shell call allowed and one
denied, a file write with its diff, a cancel mid-stream that the provider sees at once, refused
credentials, a rate limit then success, a reload that replays the conversation, and the key
searched for in the store files, the host's DEBUG log and every frame."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from e2e.host_processes import (
    Host,
    assert_only_protocol_lines,
    connector_client,
    home_env,
    private_short_dir,
    running_host,
)
from loopback import LoopbackProvider, Reply, chunk, error_reply, text_reply, tool_call_reply
from provider_support import cancel_while_streaming

from maple_acp.testing.schema import AcpSchema

KEY = "sk-live-looking-7c1e0a9b5d3f2e4a6b8c0d1e"
#: Bounds a hang; each step takes well under a second.
DEADLINE = 30.0


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A socket path must fit in sun_path: a short private directory."""
    with private_short_dir("macp-p-") as path:
        yield path


@asynccontextmanager
async def provider_host(short_dir: Path, provider: LoopbackProvider) -> AsyncIterator[Host]:
    """``maple-acp serve`` on ``short_dir`` with the loopback ``provider`` and DEBUG logs."""
    env = home_env(short_dir, XDG_CONFIG_HOME=os.fspath(short_dir / "cfg"), PROVIDER_KEY=KEY)
    async with running_host(
        short_dir,
        *("--provider-url", provider.base_url, "--model", "test-model"),
        *("--api-key-env", "PROVIDER_KEY", "--log-level", "debug"),
        env=env,
    ) as host:
        yield host


def diff_blocks(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        block
        for update in updates
        if update["sessionUpdate"] in ("tool_call", "tool_call_update")
        for block in update.get("content") or ()
        if block.get("type") == "diff"
    ]


async def test_a_conversation_through_the_connector(
    short_dir: Path, provider: LoopbackProvider, acp_schema: AcpSchema
) -> None:
    project = short_dir / "project"
    project.mkdir()
    (project / "notes.md").write_text("old\n")
    provider.add(
        # 1: a streamed answer with reasoning and usage
        Reply(
            events=[
                chunk(reasoning="thinking"),
                chunk(content="Hello "),
                chunk(content="there"),
                chunk(finish_reason="stop"),
                {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 2}},
            ]
        ),
        # 2: shell, allowed
        tool_call_reply(("s1", "shell", {"command": "echo ran > allowed.txt; echo fine"})),
        text_reply("the command ran"),
        # 3: shell, denied
        tool_call_reply(("s2", "shell", {"command": "touch denied.txt"})),
        text_reply("understood"),
        # 4: a file write with a diff
        tool_call_reply(("w", "write_file", {"path": "notes.md", "content": "new\n"})),
        text_reply("written"),
        # 5: refused credentials
        error_reply(401, f"Incorrect API key provided: {KEY}"),
        # 6: a rate limit, then success
        error_reply(429, "slow down", retry_after="0"),
        text_reply("after the wait"),
        # 7: an answer cut at the token limit
        text_reply(" and then", finish="length"),
    )
    decisions = iter(["allow", "reject", "allow"])
    with trio.fail_after(DEADLINE * 2):
        async with (
            provider_host(short_dir, provider) as host,
            connector_client(host.socket, permission=lambda p: next(decisions)) as connector,
        ):
            client = connector.client
            await client.initialize()
            sid = (await client.new_session(os.fspath(project)))["sessionId"]

            answer = await client.prompt(sid, "hello?")
            assert answer["stopReason"] == "end_turn"
            assert answer["usage"]["inputTokens"] == 11
            assert client.text(sid) == "Hello there"
            assert client.text(sid, "agent_thought_chunk") == "thinking"

            assert (await client.prompt(sid, "run it"))["stopReason"] == "end_turn"
            assert (project / "allowed.txt").read_text() == "ran\n"
            assert (await client.prompt(sid, "run that"))["stopReason"] == "end_turn"
            assert not (project / "denied.txt").exists()
            assert len(client.permission_requests) == 2

            await client.prompt(sid, "rewrite notes")
            assert (project / "notes.md").read_text() == "new\n"
            diffs = diff_blocks(client.updates(sid))
            assert diffs
            assert diffs[-1]["oldText"] == "old\n"
            assert diffs[-1]["newText"] == "new\n"

            before = len(client.inbound())
            assert (await client.prompt(sid, "again"))["stopReason"] == "end_turn"
            late = b"".join(f.raw for f in client.frames if f.direction == "in")
            assert b"the provider refused the credentials (HTTP 401)" in late
            assert len(client.inbound()) > before

            assert (await client.prompt(sid, "retry"))["stopReason"] == "end_turn"
            assert client.text(sid).endswith("after the wait")
            assert (await client.prompt(sid, "go on"))["stopReason"] == "max_tokens"

            client.validate(acp_schema)
            assert_only_protocol_lines(client)
            frames = b"".join(frame.raw for frame in client.frames)
        log = host.stderr.text
        stored = b"".join(
            path.read_bytes() for path in sorted((short_dir / "data").rglob("*")) if path.is_file()
        )
    told = provider.chat_requests()[4].body["messages"][-1]["content"]
    assert told == "the user denied this tool call"
    # The key reached the provider on every request, and nowhere else.
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in provider.requests)
    assert "DEBUG" in log
    assert KEY not in log
    assert KEY.encode() not in frames
    assert stored
    assert KEY.encode() not in stored


async def test_cancel_through_the_connector_closes_the_provider_stream(
    short_dir: Path, provider: LoopbackProvider
) -> None:
    project = short_dir / "project"
    project.mkdir()
    provider.add(Reply(events=[chunk(content="streaming")], stall=True))
    with trio.fail_after(DEADLINE):
        async with (
            provider_host(short_dir, provider) as host,
            connector_client(host.socket) as connector,
        ):
            client = connector.client
            await client.initialize()
            sid = (await client.new_session(os.fspath(project)))["sessionId"]
            answer = await cancel_while_streaming(client, sid, provider, "streaming")
            assert answer["stopReason"] == "cancelled"


async def test_a_reload_replays_the_conversation_and_the_next_turn_sees_it(
    short_dir: Path, provider: LoopbackProvider, acp_schema: AcpSchema
) -> None:
    project = short_dir / "project"
    project.mkdir()
    (project / "a.txt").write_text("alpha\n")
    provider.add(
        tool_call_reply(("c", "read_file", {"path": "a.txt"}), text="Reading."),
        text_reply("It says alpha."),
        text_reply("Still alpha."),
    )
    with trio.fail_after(DEADLINE):
        async with provider_host(short_dir, provider) as host:
            async with connector_client(host.socket) as first:
                await first.client.initialize()
                sid = (await first.client.new_session(os.fspath(project)))["sessionId"]
                await first.client.prompt(sid, "what is in a.txt?")
            async with connector_client(host.socket) as second:
                client = second.client
                await client.initialize()
                await client.load_session(sid, os.fspath(project))
                kinds = [u["sessionUpdate"] for u in client.updates(sid)]
                assert kinds[0] == "user_message_chunk"
                assert "tool_call" in kinds
                assert "It says alpha." in client.text(sid)
                await client.prompt(sid, "sure?")
                client.validate(acp_schema)
    roles = [m["role"] for m in provider.chat_requests()[2].body["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
