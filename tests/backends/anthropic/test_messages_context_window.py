"""Anthropic's "prompt is too long" is named as the context window and not retried (its
message is read to classify the error, never shown)."""

from __future__ import annotations

from pathlib import Path

from anthropic_support import messages_acp
from messages_loopback import MessagesProvider, Reply

TOO_LONG = Reply(
    status=400,
    body={
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 210000 tokens > 200000 maximum",
        },
    },
)


async def test_a_prompt_too_long_is_named_and_not_retried(
    tmp_path: Path, messages_provider: MessagesProvider, project: Path
) -> None:
    messages_provider.add(*[TOO_LONG] * 4)
    async with messages_acp(tmp_path, messages_provider) as harness, harness.connect() as client:
        await client.initialize()
        sid = (await client.new_session(str(project)))["sessionId"]
        await client.prompt(sid, "hi")
        shown = client.text(sid)
    # The configured window (the harness's model has one); the estimate of "hi" fits it.
    assert (
        "the request does not fit the model's context window of 200,000 tokens (HTTP 400)" in shown
    )
    assert "210000" not in shown
    assert len(messages_provider.message_requests()) == 1
