"""Unknown is not zero on the Messages engine: a compatible server whose stream carries no
usage gets a prompt answer without ``usage``, not counts of zero."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anthropic_support import messages_acp
from messages_loopback import MessagesProvider, Reply, text_block, text_reply

from maple_acp.testing.schema import AcpSchema


def without_usage(text: str) -> Reply:
    start: dict[str, Any] = {
        "type": "message_start",
        "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": []},
    }
    end = [
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}},
        {"type": "message_stop"},
    ]
    return Reply(events=[start, *text_block(0, text), *end])


async def test_a_stream_without_usage_answers_without_usage(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path, acp_schema: AcpSchema
) -> None:
    messages_provider.add(without_usage("Hello"), text_reply("Again"))
    async with messages_acp(tmp_path, messages_provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        unreported = await client.prompt(sid, "hi")
        reported = await client.prompt(sid, "again")
        assert client.text(sid) == "HelloAgain"
        client.validate(acp_schema)
    assert unreported == {"stopReason": "end_turn"}
    assert reported["usage"]["inputTokens"] == 10
