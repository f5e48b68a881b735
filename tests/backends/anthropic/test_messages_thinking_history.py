"""Thinking kept in the task history with its signature: a later turn's request (and one made
by a new host over the same store, after a reload) carries the first turn's thinking block
back with its exact text and signature; each thinking block of an answer is signed apart; a
thought without a signature is never sent back. Through ACP, the real runtime, a real SQLite
file and the loopback Messages server; every frame validated against the ACP schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anthropic_support import messages_acp
from messages_loopback import (
    MessagesProvider,
    Reply,
    message_end,
    message_start,
    text_block,
    text_reply,
    thinking_block,
    tool_reply,
)

from maple_acp.testing.schema import AcpSchema

SIGNATURE = "RXF1aXZhbGVudCBzaWduYXR1cmUgb25lLCBleGFjdGx5Lg=="
LATER = "c2Vjb25kIGJsb2NrJ3Mgc2lnbmF0dXJl"


def thinking_reply(*blocks: tuple[str, str], text: str) -> Reply:
    events: list[Any] = [message_start()]
    for index, (thinking, signature) in enumerate(blocks):
        events.extend(thinking_block(index, thinking, signature))
    events.extend(text_block(len(blocks), text))
    return Reply(events=[*events, *message_end()])


async def test_a_later_turn_and_a_reloaded_host_send_the_thinking_back_signed(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path, acp_schema: AcpSchema
) -> None:
    messages_provider.add(
        thinking_reply(("Consider alpha.", SIGNATURE), ("Then beta.", LATER), text="Alpha."),
        text_reply("Second."),
        text_reply("Third."),
    )
    async with (
        messages_acp(tmp_path, messages_provider) as harness,
        harness.connect() as client,
    ):
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "first")
        assert client.text(sid, "agent_thought_chunk") == "Consider alpha.Then beta."
        await client.prompt(sid, "second")
        assert client.validate(acp_schema) > 3
    # A new host over the same store file.
    async with (
        messages_acp(tmp_path, messages_provider) as harness,
        harness.connect() as client,
    ):
        await client.initialize()
        await client.load_session(sid, str(project))
        await client.prompt(sid, "third")
        client.validate(acp_schema)
    first_answer = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Consider alpha.", "signature": SIGNATURE},
            {"type": "thinking", "thinking": "Then beta.", "signature": LATER},
            {"type": "text", "text": "Alpha."},
        ],
    }
    _, second, third = (r.body["messages"] for r in messages_provider.message_requests())
    assert second[1] == first_answer
    assert third[1] == first_answer
    assert [m["role"] for m in third] == ["user", "assistant", "user", "assistant", "user"]


async def test_thinking_before_a_tool_call_goes_back_in_the_next_turn_before_its_tool_use(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path, acp_schema: AcpSchema
) -> None:
    (project / "a.txt").write_text("alpha\n")
    messages_provider.add(
        tool_reply(
            ("toolu_1", "read_file", {"path": "a.txt"}), thinking=("Read it first.", SIGNATURE)
        ),
        text_reply("It says alpha."),
        text_reply("Again alpha."),
    )
    async with (
        messages_acp(tmp_path, messages_provider) as harness,
        harness.connect() as client,
    ):
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "what is in a.txt?")
        await client.prompt(sid, "and now?")
        client.validate(acp_schema)
    later = messages_provider.message_requests()[2].body["messages"]
    thinking, use = later[1]["content"]
    assert thinking == {"type": "thinking", "thinking": "Read it first.", "signature": SIGNATURE}
    assert (use["type"], use["name"]) == ("tool_use", "read_file")
    assert later[2]["content"][0]["tool_use_id"] == use["id"]
    assert later[3]["content"] == [{"type": "text", "text": "It says alpha."}]


async def test_thinking_without_a_signature_is_never_sent_back(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path, acp_schema: AcpSchema
) -> None:
    messages_provider.add(thinking_reply(("Unsigned.", ""), text="Hi."), text_reply("Again."))
    async with (
        messages_acp(tmp_path, messages_provider) as harness,
        harness.connect() as client,
    ):
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "one")
        await client.prompt(sid, "two")
        client.validate(acp_schema)
    later = messages_provider.message_requests()[1].body["messages"]
    assert later[1] == {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]}
