"""The Anthropic Messages backend seen by an ACP client: the real AcpService over the real
runtime and a real SQLite file, the backend talking to a loopback Messages server through the
real ``anthropic`` SDK and its own stream decoder. Every frame the agent sends is validated
against the ACP schema."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio
from anthropic_support import TEST_KEY, messages_acp
from messages_loopback import (
    MessagesProvider,
    Reply,
    error_reply,
    message_end,
    message_start,
    overloaded_reply,
    text_block,
    text_reply,
    thinking_block,
    tool_reply,
)

from maple_acp.testing.schema import AcpSchema


def usage_updates(client: Any, sid: str) -> list[dict[str, Any]]:
    return [u for u in client.updates(sid) if u["sessionUpdate"] == "usage_update"]


async def test_a_streamed_answer_with_thinking_cache_tokens_and_cost(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path, acp_schema: AcpSchema
) -> None:
    messages_provider.add(
        Reply(
            events=[
                message_start(100, cache_read=1000, cache_write=200),
                *thinking_block(0, "pondering", "sig-1"),
                *text_block(1, "Hello ", "from Claude"),
                *message_end("end_turn", 50),
            ]
        )
    )
    async with (
        messages_acp(tmp_path, messages_provider, prices=True) as harness,
        harness.connect() as client,
    ):
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, "hello?")
        assert answer["stopReason"] == "end_turn"
        assert client.text(sid) == "Hello from Claude"
        assert client.text(sid, "agent_thought_chunk") == "pondering"
        usage = answer["usage"]
        assert (usage["inputTokens"], usage["outputTokens"]) == (1300, 50)
        assert (usage["cachedReadTokens"], usage["cachedWriteTokens"]) == (1000, 200)
        [update] = usage_updates(client, sid)
        assert (update["used"], update["size"]) == (1350, 200_000)
        # 100*3 + 50*15 + 1000*0.3 + 200*3.75 per million tokens.
        assert update["cost"] == {"amount": pytest.approx(0.0021), "currency": "USD"}
        assert client.validate(acp_schema) > 3
    [request] = messages_provider.message_requests()
    assert request.path == "/v1/messages"
    assert request.headers["authorization"] == f"Bearer {TEST_KEY}"
    body = request.body
    assert body["stream"] is True
    assert body["model"] == "test-model"


async def test_cost_is_cumulative_and_never_invented_without_prices(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path, acp_schema: AcpSchema
) -> None:
    for priced in (True, False):
        (tmp_path / str(priced)).mkdir()
        messages_provider.add(text_reply("one", input_tokens=1000), text_reply("two"))
        async with (
            messages_acp(tmp_path / str(priced), messages_provider, prices=priced) as harness,
            harness.connect() as client,
        ):
            await client.initialize()
            sid = (await client.new_session(str(project)))["sessionId"]
            await client.prompt(sid, "first")
            await client.prompt(sid, "second")
            costs = [u.get("cost") for u in usage_updates(client, sid)]
            client.validate(acp_schema)
        if priced:
            # 1000*3 + 5*15, then 10*3 + 5*15, per million tokens: the session's running sum.
            assert [c["amount"] for c in costs] == pytest.approx([0.003075, 0.00318])
        else:
            assert costs == [None, None]


async def test_shell_allowed_and_denied_over_acp(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path, acp_schema: AcpSchema
) -> None:
    messages_provider.add(
        tool_reply(("toolu_1", "shell", {"command": "echo yes > allowed.txt"})),
        text_reply("done"),
        tool_reply(("toolu_2", "shell", {"command": "echo no > denied.txt"})),
        text_reply("not done"),
    )
    decisions = iter(["allow", "reject"])
    async with (
        messages_acp(tmp_path, messages_provider) as harness,
        harness.connect(permission=lambda params: next(decisions)) as client,
    ):
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await client.prompt(sid, "allow it"))["stopReason"] == "end_turn"
        assert (await client.prompt(sid, "deny it"))["stopReason"] == "end_turn"
        assert len(client.permission_requests) == 2
        client.validate(acp_schema)
    assert (project / "allowed.txt").read_text() == "yes\n"
    assert not (project / "denied.txt").exists()
    requests = messages_provider.message_requests()
    allowed = requests[1].body["messages"][-1]["content"]
    assert allowed[0]["type"] == "tool_result"
    assert allowed[0]["tool_use_id"] == "toolu_1"
    assert allowed[0]["content"] == "exit code 0\n"
    denied = requests[3].body["messages"][-1]["content"]
    assert (denied[0]["tool_use_id"], denied[0]["content"]) == (
        "toolu_2",
        "the user denied this tool call",
    )


@pytest.mark.parametrize("status", [401, 403])
async def test_refused_credentials_fail_the_turn_with_one_line(
    tmp_path: Path,
    messages_provider: MessagesProvider,
    project: Path,
    acp_schema: AcpSchema,
    status: int,
) -> None:
    messages_provider.add(error_reply(status, f"invalid x-api-key {TEST_KEY}"))
    async with messages_acp(tmp_path, messages_provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, "hi")
        client.validate(acp_schema)
        frames = b"".join(frame.raw for frame in client.frames)
    assert answer["stopReason"] == "end_turn"
    assert f"the provider refused the credentials (HTTP {status})".encode() in frames
    assert TEST_KEY.encode() not in frames
    assert len(messages_provider.message_requests()) == 1


async def test_an_unknown_model_has_its_own_line(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    messages_provider.add(error_reply(404, "model: test-model"))
    async with messages_acp(tmp_path, messages_provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "hi")
        assert "the provider does not know the model 'test-model' (HTTP 404)" in client.text(sid)


async def test_a_rate_limit_then_success(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    messages_provider.add(error_reply(429, "slow", retry_after="0"), text_reply("eventually"))
    async with messages_acp(tmp_path, messages_provider) as harness, harness.connect() as client:
        await client.initialize(clientCapabilities={"session": {"notices": {}}})
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await client.prompt(sid, "hi"))["stopReason"] == "end_turn"
        assert client.text(sid) == "eventually"
        [notice] = [u for u in client.updates(sid) if u["sessionUpdate"] == "notice"]
        assert notice["severity"] == "warning"
        assert "limiting the rate" in notice["title"]
    assert len(messages_provider.message_requests()) == 2


async def test_overloaded_is_retried_three_times_then_one_line(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    messages_provider.add(*(overloaded_reply(retry_after_ms="1") for _ in range(4)))
    async with messages_acp(tmp_path, messages_provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "hi")
        assert client.text(sid).endswith(
            "the provider is overloaded (HTTP 529); gave up after 3 retries"
        )
    assert len(messages_provider.message_requests()) == 4


async def test_an_overloaded_error_event_before_any_text_is_retried(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    messages_provider.add(Reply(events=[message_start(), error]), text_reply("after the storm"))
    async with messages_acp(tmp_path, messages_provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "hi")
        # Without notices the retry is told as a thought, never mixed into the answer.
        assert client.text(sid) == "after the storm"
        assert "overloaded" in client.text(sid, "agent_thought_chunk")


@pytest.mark.parametrize(
    "events",
    [
        ["event: message_start\ndata: {not json\n\n"],
        [message_start(), {"type": "content_block_delta", "index": 7, "delta": {}}],
        [message_start(), *text_block(0, "partial")],
    ],
    ids=["bad-json", "delta-without-block", "no-message-stop"],
)
async def test_a_malformed_or_unfinished_stream_is_one_line(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path, events: list[Any]
) -> None:
    messages_provider.add(*(Reply(events=events) for _ in range(4)))
    async with messages_acp(tmp_path, messages_provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        answer = await client.prompt(sid, "hi")
        assert answer["stopReason"] == "end_turn"
        text = client.text(sid)
    assert (
        "the provider sent a malformed stream" in text
        or "the provider's stream broke off before the answer ended" in text
    )


async def test_cancel_mid_stream_closes_the_connection_within_a_second(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path, acp_schema: AcpSchema
) -> None:
    messages_provider.add(
        Reply(events=[message_start(), *text_block(0, "working on it")[:2]], stall=True)
    )
    async with messages_acp(tmp_path, messages_provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        answers: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def prompt() -> None:
                answers.append(await client.prompt(sid, "go"))

            nursery.start_soon(prompt)
            await client.wait_until(lambda: client.text(sid) == "working on it")
            await messages_provider.streaming.wait()
            closed = messages_provider.closed_event
            await client.cancel(sid)
            with trio.fail_after(1):
                await closed.wait()
        assert answers[0]["stopReason"] == "cancelled"
        client.validate(acp_schema)


async def test_a_reload_replays_and_the_next_turn_sees_the_history(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path, acp_schema: AcpSchema
) -> None:
    (project / "a.txt").write_text("alpha\n")
    messages_provider.add(
        tool_reply(("toolu_r", "read_file", {"path": "a.txt"}), text="Reading."),
        text_reply("It says alpha."),
        text_reply("Still alpha."),
    )
    async with messages_acp(tmp_path, messages_provider) as harness:
        async with harness.connect() as first:
            await first.initialize()
            sid = (await first.new_session(str(project)))["sessionId"]
            await first.prompt(sid, "what is in a.txt?")
        async with harness.connect() as second:
            await second.initialize()
            await second.load_session(sid, str(project))
            kinds = [u["sessionUpdate"] for u in second.updates(sid)]
            assert kinds[0] == "user_message_chunk"
            assert "tool_call" in kinds
            assert "It says alpha." in second.text(sid)
            await second.prompt(sid, "and now?")
            second.validate(acp_schema)
    messages = messages_provider.message_requests()[2].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"] == [{"type": "text", "text": "what is in a.txt?"}]
    text, use = messages[1]["content"]
    assert text == {"type": "text", "text": "Reading."}
    assert (use["type"], use["name"], use["input"]) == ("tool_use", "read_file", {"path": "a.txt"})
    [result] = messages[2]["content"]
    assert (result["tool_use_id"], result["content"]) == (use["id"], "alpha\n")
    assert messages[3]["content"] == [{"type": "text", "text": "It says alpha."}]
    assert messages[4]["content"][0]["text"] == "and now?"


async def test_the_key_is_nowhere_it_must_not_be(
    tmp_path: Path,
    messages_provider: MessagesProvider,
    project: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    messages_provider.add(
        text_reply("fine"),
        error_reply(401, f"invalid key {TEST_KEY}"),
        *(error_reply(500, f"internal: {TEST_KEY}") for _ in range(4)),
    )
    caplog.set_level(logging.DEBUG)
    async with messages_acp(tmp_path, messages_provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        for prompt in ("one", "two", "three"):
            await client.prompt(sid, prompt)
        frames = b"".join(frame.raw for frame in client.frames)
        store_files = sorted(harness.store_path.parent.glob(harness.store_path.name + "*"))
        stored = b"".join(path.read_bytes() for path in store_files)
    assert len(messages_provider.message_requests()) == 6
    assert b"fine" in frames
    assert TEST_KEY.encode() not in stored
    assert TEST_KEY.encode() not in frames
    assert TEST_KEY not in caplog.text


async def test_stop_reasons_reach_the_client(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path, acp_schema: AcpSchema
) -> None:
    messages_provider.add(text_reply("cut", stop="max_tokens"), text_reply("no", stop="refusal"))
    async with messages_acp(tmp_path, messages_provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        assert (await client.prompt(sid, "long"))["stopReason"] == "max_tokens"
        assert (await client.prompt(sid, "bad"))["stopReason"] == "refusal"
        client.validate(acp_schema)
