"""The conversation a request carries: rebuilt from the task's history, and trimmed to fit a
known context window. Pure functions over Chat Completions message dicts."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from maple_acp.backends.provider import runs_of, tool_name, tool_outcome
from maple_acp.model import ImageRef, ItemKind, TimelineItem
from maple_acp.runtime import describe_image

Message = dict[str, Any]

#: Rough characters per token for the estimate used before a request (the provider's own
#: count, when it reports one, is what the caller sees as context usage).
CHARS_PER_TOKEN = 4
#: Fixed cost of each message's envelope, in estimated tokens.
MESSAGE_OVERHEAD_TOKENS = 4
#: What replaces a tool output dropped to fit the window, so the model knows it existed.
DROPPED_OUTPUT = "[output dropped to fit the context window]"

#: What one image is estimated to cost, in tokens (a detailed 1024x1024 image costs ~800 at
#: the providers that publish their rule).
IMAGE_TOKENS = 1_000

#: This engine's transcripts (``Turn.keep_transcript``): Chat Completions messages.
TRANSCRIPT_FORMAT = "chat-completions"


def data_url(image: ImageRef, data: bytes) -> str:
    """An image as the ``data:`` URL Chat Completions takes in an ``image_url`` part."""
    return f"data:{image.mime_type};base64,{base64.b64encode(data).decode('ascii')}"


def user_message(text: str, images: Sequence[ImageRef], urls: Mapping[str, str]) -> Message:
    """A user message: plain text, or (with images) a text part and one ``image_url`` part
    per image whose URL ``urls`` holds (by SHA-256); any other image is named in text."""
    if not images:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = []
    missing = [
        f"[{describe_image(image)}: not sent]" for image in images if image.sha256 not in urls
    ]
    shown = "\n\n".join(part for part in (text, "\n".join(missing)) if part)
    if shown:
        parts.append({"type": "text", "text": shown})
    for image in images:
        url = urls.get(image.sha256)
        if url is not None:
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"role": "user", "content": parts}


def history_messages(
    items: Sequence[TimelineItem], urls: Mapping[str, str] | None = None
) -> list[Message]:
    """Chat messages for a task's visible history: user and agent messages (a user message's
    images as ``image_url`` parts when ``urls`` has them), and each tool call as an assistant
    ``tool_calls`` entry followed by its result. Thoughts and plans are not sent back
    (providers do not accept foreign reasoning)."""
    urls = urls or {}
    messages: list[Message] = []
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[Message] = []

    def flush() -> None:
        if text or calls:
            message: Message = {"role": "assistant", "content": "".join(text)}
            if calls:
                message["tool_calls"] = list(calls)
            messages.append(message)
            messages.extend(results)
        text.clear()
        calls.clear()
        results.clear()

    for item in items:
        if item.kind is ItemKind.USER:
            flush()
            messages.append(user_message(item.text, item.images, urls))
        elif item.kind is ItemKind.ASSISTANT:
            if calls:
                flush()
            text.append(item.text)
        elif item.kind is ItemKind.TOOL and item.tool is not None:
            call_id = f"call_{len(messages)}_{len(calls)}"
            tool = item.tool
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": tool_name(tool.name), "arguments": _arguments(tool)},
                }
            )
            results.append({"role": "tool", "tool_call_id": call_id, "content": tool_outcome(tool)})
    flush()
    return messages


def replayed_messages(
    items: Sequence[TimelineItem],
    urls: Mapping[str, str],
    transcripts: Mapping[str, list[Message]],
    current_run: str,
) -> tuple[list[Message], int | None]:
    """The history as messages: a run with a transcript as its user message and then the
    messages it sent, byte for byte; any other run rebuilt from its rows. Also where the
    current run's part (after its user message) starts, if the history holds it already (a
    later turn of the same run)."""
    messages: list[Message] = []
    mark = None
    for run_id, rows in runs_of(items):
        sent = transcripts.get(run_id) if run_id is not None else None
        opens = rows[0].kind is ItemKind.USER
        if sent is None:
            start = len(messages)
            messages.extend(history_messages(rows, urls))
            if run_id == current_run and opens:
                mark = start + 1
            continue
        if opens:
            messages.append(user_message(rows[0].text, rows[0].images, urls))
        if run_id == current_run:
            mark = len(messages)
        messages.extend(sent)
    return messages, mark


def _arguments(tool: Any) -> str:
    raw = tool.raw_input
    if raw is None:
        return "{}"
    try:
        return orjson.dumps(raw).decode()
    except TypeError:
        return "{}"


def estimate_tokens(message: Message) -> int:
    size = 0
    images = 0
    content = message.get("content")
    if isinstance(content, str):
        size += len(content)
    elif isinstance(content, list):
        for part in content:
            if part.get("type") == "image_url":
                images += 1
            else:
                size += len(part.get("text") or "")
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        size += len(function.get("name") or "") + len(function.get("arguments") or "")
    return size // CHARS_PER_TOKEN + MESSAGE_OVERHEAD_TOKENS + images * IMAGE_TOKENS


def fit_to_window(messages: Sequence[Message], budget: int) -> list[Message]:
    """``messages`` (system prompt first, if any, and the latest message last) cut to an
    estimated ``budget`` tokens: first the oldest tool outputs are replaced by a marker, then
    the oldest whole turns (a user message and everything up to the next one) are dropped. The
    system prompt and the latest message are always kept; so is the pairing of every tool call
    with its result. The input is not modified."""
    result = [dict(message) for message in messages]
    sizes = [estimate_tokens(message) for message in result]
    total = sum(sizes)
    if total <= budget or len(result) <= 1:
        return result
    head = 1 if result[0].get("role") == "system" else 0
    last = len(result) - 1
    for index in range(head, last):
        if total <= budget:
            return result
        message = result[index]
        if message.get("role") == "tool" and message.get("content") != DROPPED_OUTPUT:
            message["content"] = DROPPED_OUTPUT
            new_size = estimate_tokens(message)
            total -= sizes[index] - new_size
            sizes[index] = new_size
    if total <= budget:
        return result
    # Drop the oldest turns. A turn starts at a user message; the one holding the latest
    # message (the last start) is never dropped, so no tool result loses its call.
    keep_from = head
    for start in range(head + 1, len(result)):
        if total <= budget:
            break
        if result[start].get("role") != "user":
            continue
        total -= sum(sizes[keep_from:start])
        keep_from = start
    return result[:head] + result[keep_from:]
