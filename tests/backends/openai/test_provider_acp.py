"""The provider backend seen by an ACP client: the real AcpService over the real runtime and a
real SQLite file, the backend talking to the loopback server through the real SDK. Every frame
the agent sends is validated against the ACP schema, and the key is searched for everywhere
it must never be: the store (with its -wal and -shm files), DEBUG logs and every frame."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from loopback import LoopbackProvider, Reply, chunk, error_reply, text_reply, tool_call_reply
from provider_support import TEST_KEY, cancel_while_streaming

from maple_acp.backends import build_backend, provider_config_from_flags, provider_policy
from maple_acp.testing.schema import AcpSchema
from maple_acp.testing.service import AcpHarness, running_demo_acp


@asynccontextmanager
async def provider_acp(tmp_path: Path, provider: LoopbackProvider) -> AsyncIterator[AcpHarness]:
    config = provider_config_from_flags(
        provider.base_url, "test-model", api_key_env="TEST_PROVIDER_KEY"
    )
    backend, catalog = build_backend(config, {"TEST_PROVIDER_KEY": TEST_KEY}, backoff=(0.0,))
    async with (
        backend,
        running_demo_acp(
            tmp_path, backend=backend, catalog=catalog, policy=provider_policy()
        ) as harness,
    ):
        yield harness


def tool_updates(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [u for u in updates if u["sessionUpdate"] in ("tool_call", "tool_call_update")]


async def test_prompt_streams_an_answer_with_usage(
    tmp_path: Path, provider: LoopbackProvider, project: Path, acp_schema: AcpSchema
) -> None:
    provider.add(
        Reply(
            events=[
                chunk(reasoning_content="pondering"),
                chunk(content="Hello "),
                chunk(content="from the model"),
                chunk(finish_reason="stop"),
                {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}},
            ]
        )
    )
    async with provider_acp(tmp_path, provider) as harness, harness.connect() as client:
        await client.initialize()
        session = await client.new_session(str(project))
        sid = session["sessionId"]
        answer = await client.prompt(sid, "hello?")
        assert answer["stopReason"] == "end_turn"
        assert answer["usage"]["inputTokens"] == 7
        assert answer["usage"]["outputTokens"] == 4
        assert client.text(sid) == "Hello from the model"
        assert client.text(sid, "agent_thought_chunk") == "pondering"
        model_option = next(o for o in session["configOptions"] if o["id"] == "model")
        assert model_option["currentValue"] == "provider/test-model"
        assert client.validate(acp_schema) > 3


async def test_shell_permission_allowed_and_denied_over_acp(
    tmp_path: Path, provider: LoopbackProvider, project: Path, acp_schema: AcpSchema
) -> None:
    provider.add(
        tool_call_reply(("c1", "shell", {"command": "echo yes > allowed.txt"})),
        text_reply("done"),
        tool_call_reply(("c2", "shell", {"command": "echo no > denied.txt"})),
        text_reply("not done"),
    )
    decisions = iter(["allow", "reject"])
    async with (
        provider_acp(tmp_path, provider) as harness,
        harness.connect(permission=lambda params: next(decisions)) as client,
    ):
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await client.prompt(sid, "allow it"))["stopReason"] == "end_turn"
        assert (await client.prompt(sid, "deny it"))["stopReason"] == "end_turn"
        assert len(client.permission_requests) == 2
        assert client.permission_requests[0]["toolCall"]["title"].startswith("shell: ")
        client.validate(acp_schema)
    assert (project / "allowed.txt").read_text() == "yes\n"
    assert not (project / "denied.txt").exists()
    told = provider.chat_requests()[3].body["messages"][-1]["content"]
    assert told == "the user denied this tool call"


async def test_write_file_carries_a_diff_over_acp(
    tmp_path: Path, provider: LoopbackProvider, project: Path, acp_schema: AcpSchema
) -> None:
    (project / "notes.md").write_text("old line\n")
    provider.add(
        tool_call_reply(("w", "write_file", {"path": "notes.md", "content": "new line\n"})),
        text_reply("written"),
    )
    async with provider_acp(tmp_path, provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "rewrite notes")
        client.validate(acp_schema)
        updates = tool_updates(client.updates(sid))
    assert (project / "notes.md").read_text() == "new line\n"
    diffs = [
        block
        for update in updates
        for block in update.get("content") or ()
        if block.get("type") == "diff"
    ]
    assert diffs
    assert diffs[-1]["path"] == str((project / "notes.md").resolve())
    assert diffs[-1]["oldText"] == "old line\n"
    assert diffs[-1]["newText"] == "new line\n"


async def test_cancel_mid_stream_answers_cancelled_and_closes_the_connection(
    tmp_path: Path, provider: LoopbackProvider, project: Path, acp_schema: AcpSchema
) -> None:
    provider.add(Reply(events=[chunk(content="working on it")], stall=True))
    async with provider_acp(tmp_path, provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await cancel_while_streaming(client, sid, provider, "working on it")
        assert answer["stopReason"] == "cancelled"
        client.validate(acp_schema)


async def test_refused_credentials_fail_the_turn_with_a_clear_line(
    tmp_path: Path, provider: LoopbackProvider, project: Path, acp_schema: AcpSchema
) -> None:
    provider.add(error_reply(401, f"Incorrect API key provided: {TEST_KEY}"))
    async with provider_acp(tmp_path, provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, "hi")
        client.validate(acp_schema)
        frames = b"".join(frame.raw for frame in client.frames)
    assert answer["stopReason"] == "end_turn"
    assert b"the provider refused the credentials (HTTP 401)" in frames
    assert TEST_KEY.encode() not in frames


async def test_a_rate_limit_then_success_over_acp(
    tmp_path: Path, provider: LoopbackProvider, project: Path
) -> None:
    provider.add(error_reply(429, "slow", retry_after="0"), text_reply("eventually"))
    async with provider_acp(tmp_path, provider) as harness, harness.connect() as client:
        await client.initialize(clientCapabilities={"session": {"notices": {}}})
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await client.prompt(sid, "hi"))["stopReason"] == "end_turn"
        assert client.text(sid) == "eventually"
        # The retry was told as a warning notice, not mixed into the answer.
        [notice] = [u for u in client.updates(sid) if u["sessionUpdate"] == "notice"]
        assert notice["severity"] == "warning"
        assert "retrying in 1 s" in notice["title"]


async def test_a_reload_replays_the_conversation_and_the_next_turn_sees_it(
    tmp_path: Path, provider: LoopbackProvider, project: Path, acp_schema: AcpSchema
) -> None:
    (project / "a.txt").write_text("alpha\n")
    provider.add(
        tool_call_reply(("c", "read_file", {"path": "a.txt"}), text="Reading."),
        text_reply("It says alpha."),
        text_reply("Still alpha."),
    )
    async with provider_acp(tmp_path, provider) as harness:
        async with harness.connect() as first:
            await first.initialize()
            sid = (await first.new_session(str(project)))["sessionId"]
            await first.prompt(sid, "what is in a.txt?")
        async with harness.connect() as second:
            await second.initialize()
            await second.load_session(sid, str(project))
            replayed = second.updates(sid)
            kinds = [u["sessionUpdate"] for u in replayed]
            assert kinds[0] == "user_message_chunk"
            assert "tool_call" in kinds
            assert "It says alpha." in second.text(sid)
            await second.prompt(sid, "and now?")
            second.validate(acp_schema)
    messages = provider.chat_requests()[2].body["messages"]
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert messages[3]["content"] == "alpha\n"


async def test_the_key_is_nowhere_it_must_not_be(
    tmp_path: Path,
    provider: LoopbackProvider,
    project: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    (project / "a.txt").write_text("alpha\n")
    provider.add(
        tool_call_reply(("c", "read_file", {"path": "a.txt"})),
        text_reply("fine"),
        error_reply(401, f"Incorrect API key provided: {TEST_KEY}"),
        error_reply(500, f"internal: {TEST_KEY}"),
        error_reply(500, f"internal: {TEST_KEY}"),
        error_reply(500, f"internal: {TEST_KEY}"),
        error_reply(500, f"internal: {TEST_KEY}"),
    )
    caplog.set_level(logging.DEBUG)
    async with provider_acp(tmp_path, provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "one")
        await client.prompt(sid, "two")
        await client.prompt(sid, "three")
        frames = b"".join(frame.raw for frame in client.frames)
        store_files = sorted(harness.store_path.parent.glob(harness.store_path.name + "*"))
        stored = b"".join(path.read_bytes() for path in store_files)
    # The key did reach the provider (so the search below is meaningful) ...
    assert all(r.headers["authorization"] == f"Bearer {TEST_KEY}" for r in provider.requests)
    assert len(provider.chat_requests()) == 7
    assert b"fine" in frames
    # ... and nowhere else.
    assert {path.name[len(harness.store_path.name) :] for path in store_files} >= {"", "-wal"}
    assert TEST_KEY.encode() not in stored
    assert TEST_KEY.encode() not in frames
    debug_lines = [record.getMessage() for record in caplog.records]
    assert any(record.levelno == logging.DEBUG for record in caplog.records)
    assert not [line for line in debug_lines if TEST_KEY in line]
    assert TEST_KEY not in caplog.text


async def test_stop_reasons_reach_the_client(
    tmp_path: Path, provider: LoopbackProvider, project: Path, acp_schema: AcpSchema
) -> None:
    provider.add(text_reply("cut", finish="length"), text_reply("", finish="content_filter"))
    async with provider_acp(tmp_path, provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await client.prompt(sid, "long"))["stopReason"] == "max_tokens"
        assert (await client.prompt(sid, "bad"))["stopReason"] == "refusal"
        client.validate(acp_schema)
