"""The conversation an Anthropic Messages request carries: the task's history rebuilt into
``user``/``assistant`` messages of content blocks (signed thinking as it came, each
``tool_use`` followed at once by its ``tool_result``), the tool definitions in the Messages
shape, and the prompt-cache breakpoints. Pure functions over plain dicts; no SDK import."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from maple_acp.backends.provider import runs_of, tool_name, tool_outcome
from maple_acp.model import ImageRef, ItemKind, TimelineItem
from maple_acp.runtime import describe_image

Message = dict[str, Any]
Block = dict[str, Any]

#: This engine's transcripts (``Turn.keep_transcript``): Messages API messages.
TRANSCRIPT_FORMAT = "anthropic-messages"
#: Where a run's part of the messages starts: the number of messages, and the number of
#: blocks of the last one (a run's first message may join a user message already last).
Mark = tuple[int, int]

#: The prompt-cache marker: the prefix up to a block carrying it is cached for reuse.
CACHE_BREAKPOINT: dict[str, str] = {"type": "ephemeral"}


def image_source(image: ImageRef, data: bytes) -> Block:
    """An image as the base64 ``source`` of a Messages ``image`` block."""
    return {
        "type": "base64",
        "media_type": image.mime_type,
        "data": base64.b64encode(data).decode("ascii"),
    }


def history_messages(
    items: Sequence[TimelineItem],
    messages: list[Message] | None = None,
    sources: Mapping[str, Block] | None = None,
) -> list[Message]:
    """Messages for a task's visible history: user text, agent text, each signed thought as
    the ``thinking`` block it came from (text and signature verbatim: the provider accepts
    its thinking back only so), and each tool call as a ``tool_use`` block in the
    assistant's message with its ``tool_result`` in the next user message. Unsigned thoughts
    (another engine's, or thinking whose signature was not kept) are not sent back, and
    plans are not messages. A user message's images go as ``image`` blocks when ``sources``
    (by SHA-256) holds them, else named in its text. They are added to ``messages`` (a new list
    without it), joined to a user message already last."""
    messages = [] if messages is None else messages
    #: The assistant's blocks so far, in the order they came (text is joined into one block
    #: per run of text).
    blocks: list[Block] = []
    text: list[str] = []
    results: list[Block] = []

    def end_text() -> None:
        joined = "".join(text)
        if joined.strip():
            blocks.append({"type": "text", "text": joined})
        text.clear()

    def flush() -> None:
        end_text()
        if blocks:
            append_blocks(messages, "assistant", list(blocks))
        if results:
            append_blocks(messages, "user", list(results))
        blocks.clear()
        results.clear()

    for item in items:
        if item.kind is ItemKind.USER:
            flush()
            if item.images:
                user_text(messages, item.text, item.images, sources or {})
            elif item.text.strip():
                append_blocks(messages, "user", [{"type": "text", "text": item.text}])
        elif item.kind is ItemKind.ASSISTANT:
            if results:
                flush()
            text.append(item.text)
        elif item.kind is ItemKind.THOUGHT and item.signature and item.text:
            # Thinking opens an answer: after tool calls it belongs to the next request's.
            if results:
                flush()
            end_text()
            blocks.append({"type": "thinking", "thinking": item.text, "signature": item.signature})
        elif item.kind is ItemKind.TOOL and item.tool is not None:
            tool = item.tool
            end_text()
            use_id = f"toolu_h{len(messages)}_{len(results)}"
            raw = tool.raw_input
            blocks.append(
                {
                    "type": "tool_use",
                    "id": use_id,
                    "name": tool_name(tool.name),
                    "input": dict(raw) if isinstance(raw, dict) else {},
                }
            )
            results.append(
                {"type": "tool_result", "tool_use_id": use_id, "content": tool_outcome(tool)}
            )
    flush()
    return messages


def replay_history(
    items: Sequence[TimelineItem],
    messages: list[Message],
    sources: Mapping[str, Block],
    transcripts: Mapping[str, list[Message]],
    current_run: str,
) -> Mark | None:
    """Add the history to ``messages``: a run with a transcript as its user message and then
    the messages it sent, byte for byte; any other run rebuilt from its rows. Returns where the
    current run's part (after its user message) starts, if the history holds it already (a
    later turn of the same run)."""
    mark = None
    for run_id, rows in runs_of(items):
        sent = transcripts.get(run_id) if run_id is not None else None
        if rows[0].kind is ItemKind.USER:
            history_messages(rows[:1], messages, sources)
            rows = rows[1:]
        if run_id == current_run:
            mark = end_of(messages)
        if sent is None:
            history_messages(rows, messages, sources)
        else:
            for message in sent:
                append_blocks(messages, message["role"], list(message["content"]))
    return mark


def end_of(messages: Sequence[Message]) -> Mark:
    """The mark of what ``messages`` hold now."""
    return len(messages), len(messages[-1]["content"]) if messages else 0


def since(messages: Sequence[Message], mark: Mark) -> list[Message]:
    """What was added to ``messages`` after ``mark`` (a first message may continue the one
    at the mark)."""
    count, blocks = mark
    added: list[Message] = []
    if count and len(messages[count - 1]["content"]) > blocks:
        last = messages[count - 1]
        added.append({"role": last["role"], "content": last["content"][blocks:]})
    added.extend(messages[count:])
    return added


def user_text(
    messages: list[Message],
    text: str,
    images: Sequence[ImageRef] = (),
    sources: Mapping[str, Block] | None = None,
) -> None:
    """Add the user's ``text`` as the latest message (joined to a user message already last,
    since the Messages API alternates roles), then one ``image`` block per image whose source
    ``sources`` holds (by SHA-256); any other image is named in the text."""
    sources = sources or {}
    missing = [
        f"[{describe_image(image)}: not sent]" for image in images if image.sha256 not in sources
    ]
    shown = "\n\n".join(part for part in (text, "\n".join(missing)) if part)
    blocks: list[Block] = [{"type": "text", "text": shown or "(empty message)"}]
    for image in images:
        source = sources.get(image.sha256)
        if source is not None:
            blocks.append({"type": "image", "source": source})
    append_blocks(messages, "user", blocks)


def append_blocks(messages: list[Message], role: str, blocks: list[Block]) -> None:
    """Add ``blocks`` as a message of ``role``, joined to the last one if it has that role (the
    Messages API alternates roles)."""
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def tool_definitions(specs: Sequence[Any]) -> list[dict[str, Any]]:
    """The Messages shape of the function specs the OpenAI-compatible backend offers (the same
    tools, so the same rules and modes apply to both engines)."""
    tools = []
    for spec in specs:
        function = spec["function"]
        tools.append(
            {
                "name": function["name"],
                "description": function.get("description") or "",
                "input_schema": function["parameters"],
            }
        )
    return tools


def with_breakpoints(
    system: str, tools: list[dict[str, Any]], messages: Sequence[Message]
) -> tuple[list[Block], list[dict[str, Any]], list[Message]]:
    """Copies of the system prompt (as a block), the tools and the messages, with cache
    breakpoints on the system prompt, the last tool and the last block of the latest message:
    the next request of the turn, and the next turn, re-read that prefix from the cache. Three
    of the four breakpoints a request may carry; the stored messages are left unmarked so that
    breakpoints never pile up."""
    system_blocks: list[Block] = [
        {"type": "text", "text": system, "cache_control": CACHE_BREAKPOINT}
    ]
    marked_tools = [dict(tool) for tool in tools]
    if marked_tools:
        marked_tools[-1]["cache_control"] = CACHE_BREAKPOINT
    marked = [dict(message) for message in messages]
    if marked:
        last = marked[-1]
        blocks = [dict(block) for block in last["content"]]
        if blocks:
            blocks[-1]["cache_control"] = CACHE_BREAKPOINT
        last["content"] = blocks
    return system_blocks, marked_tools, marked
