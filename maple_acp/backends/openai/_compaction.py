"""Compaction for the OpenAI-compatible engine: when a request would fill most of a known context
window (or on ``/compact``), the model summarizes the older part of the conversation, the
summary is stored as a ``COMPACTION`` row of the history, and requests carry the summary and
the recent turns instead (what a history keeps after one: ``provider.after_compaction``). Pure
functions over Chat Completions message dicts; the request itself is the backend's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from maple_acp.backends.openai._conversation import Message
from maple_acp.backends.provider import SUMMARY_PREFIX

#: A request whose estimate (or the provider's last count) reaches this part of a known
#: context window compacts first.
COMPACT_AT_FRACTION: Final = 0.85
#: The summary's output bound (tokens): without one a local server lets a model that rambles
#: write until the turn's timeout (two minutes of a small model's summary were seen).
SUMMARY_MAX_TOKENS: Final = 1024
#: What the model is asked, after the part of the conversation it summarizes.
SUMMARY_REQUEST: Final = (
    "Summarize the conversation so far for your own later use: the user's goals and "
    "instructions, what was done and found (files, commands, results), decisions made, and "
    "what remains open. Be concise and concrete; answer with the summary only."
)


def summary_message(summary: str) -> Message:
    return {"role": "user", "content": SUMMARY_PREFIX + summary}


def split_for_compaction(
    messages: Sequence[Message],
) -> tuple[list[Message], list[Message], list[Message]] | None:
    """``messages`` as (the system prompt, the older part to summarize, the recent part: from
    the latest user message on); ``None`` when there is no older part."""
    head = 1 if messages and messages[0].get("role") == "system" else 0
    last_user = max(
        (i for i in range(head, len(messages)) if messages[i].get("role") == "user"),
        default=None,
    )
    if last_user is None or last_user == head:
        return None
    return list(messages[:head]), list(messages[head:last_user]), list(messages[last_user:])
