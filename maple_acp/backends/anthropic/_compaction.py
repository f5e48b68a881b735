"""Compaction, the Anthropic engine's part (the trigger, the events and the stored summary
are the shell's: ``provider._compaction``): a request's estimate over Messages content blocks,
where the messages may be cut (at a user message that holds no ``tool_result``, so that no
``tool_use`` loses its result), the part being summarized with its tool blocks told as text
(a request offering no tools may carry none; thinking is left out), and the summary joined
to the recent part. Pure functions over plain dicts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import orjson

from maple_acp.backends.anthropic._messages import Block, Message, append_blocks, user_text
from maple_acp.backends.provider import SUMMARY_PREFIX, SUMMARY_REQUEST

#: About this many characters make a token, for the estimate before a request (the
#: provider's own count, once it reports one, is what the shell compares instead).
CHARS_PER_TOKEN: Final = 4
#: Each message's role and framing, in estimated tokens.
MESSAGE_TOKENS: Final = 4
#: An image block, in estimated tokens (a 1,092 x 1,092 image costs about 1,600; most are
#: smaller).
IMAGE_BLOCK_TOKENS: Final = 1_000
#: A tool call's input told as text in a summary request is cut to this many characters.
MAX_TOLD_INPUT_CHARS: Final = 2_000


def estimate(system: str, messages: Sequence[Message]) -> int:
    """The estimated tokens of a request carrying ``system`` and ``messages``."""
    chars = len(system)
    images = 0
    for message in messages:
        for block in message["content"]:
            if block.get("type") == "image":
                images += 1
            else:
                chars += len(_as_text(block))
    return chars // CHARS_PER_TOKEN + len(messages) * MESSAGE_TOKENS + images * IMAGE_BLOCK_TOKENS


def recent_start(messages: Sequence[Message]) -> int | None:
    """Where the recent part starts: the latest user message holding no ``tool_result``
    block; ``None`` when no message comes before it."""
    for index in range(len(messages) - 1, 0, -1):
        message = messages[index]
        if message["role"] == "user" and not any(
            block.get("type") == "tool_result" for block in message["content"]
        ):
            return index
    return None


def summary_request(older: Sequence[Message]) -> list[Message]:
    """The messages of a summary request: ``older`` with each tool call and result told as
    text and thinking left out, then the question."""
    request: list[Message] = []
    for message in older:
        blocks: list[Block] = []
        for block in message["content"]:
            kind = block.get("type")
            if kind in ("text", "image"):
                blocks.append(block)
            elif kind in ("tool_use", "tool_result"):
                blocks.append({"type": "text", "text": _as_text(block)})
        if blocks:
            append_blocks(request, message["role"], blocks)
    user_text(request, SUMMARY_REQUEST)
    return request


def after_summary(summary: str, recent: Sequence[Message]) -> list[Message]:
    """The messages to go on with: the summary, joined to the recent part's first user
    message."""
    messages: list[Message] = []
    user_text(messages, SUMMARY_PREFIX + summary)
    for message in recent:
        append_blocks(messages, message["role"], list(message["content"]))
    return messages


def _as_text(block: Block) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text") or "")
    if kind == "thinking":
        return str(block.get("thinking") or "")
    if kind == "redacted_thinking":
        return str(block.get("data") or "")
    if kind == "tool_use":
        told = orjson.dumps(block.get("input") or {}).decode()[:MAX_TOLD_INPUT_CHARS]
        return f"[tool call {block.get('name')}: {told}]"
    if kind == "tool_result":
        return f"[tool result: {_result_text(block.get('content'))}]"
    return ""


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return ""
