"""Compaction, the OpenAI-compatible engine's part (the trigger, the events and the stored
summary are the shell's: ``provider._compaction``): where Chat Completions messages may be
cut, the summary request's messages, and the summary as a message. Pure functions over
message dicts; the request itself is the backend's."""

from __future__ import annotations

from collections.abc import Sequence

from maple_acp.backends.openai._conversation import Message
from maple_acp.backends.provider import (
    COMPACT_AT_FRACTION,
    SUMMARY_MAX_TOKENS,
    SUMMARY_PREFIX,
    SUMMARY_REQUEST,
)

__all__ = [
    "COMPACT_AT_FRACTION",
    "SUMMARY_MAX_TOKENS",
    "SUMMARY_REQUEST",
    "head_of",
    "recent_start",
    "summary_message",
]


def summary_message(summary: str) -> Message:
    return {"role": "user", "content": SUMMARY_PREFIX + summary}


def head_of(messages: Sequence[Message]) -> int:
    """How many messages lead the conversation and are never summarized: the system prompt."""
    return 1 if messages and messages[0].get("role") == "system" else 0


def recent_start(messages: Sequence[Message]) -> int | None:
    """Where the recent part starts (the latest user message); ``None`` when nothing but the
    system prompt comes before it."""
    head = head_of(messages)
    last_user = max(
        (i for i in range(head, len(messages)) if messages[i].get("role") == "user"),
        default=None,
    )
    if last_user is None or last_user == head:
        return None
    return last_user
