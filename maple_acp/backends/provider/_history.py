"""What every engine's conversation shares: the bounds of a tool result and of a request's
images, names a provider accepts for a tool, the runs a history is made of, the transcripts an
engine keeps of what it sent (so that later requests carry the same bytes), and what a
compaction leaves of a history. Pure functions over the task's rows."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

import orjson

from maple_acp.model import ImageRef, ItemKind, TimelineItem, ToolState
from maple_acp.runtime import Turn

#: A tool result the model is sent; the row shown to the user has its own bound.
MAX_TOOL_RESULT_CHARS = 32_000
#: Images one request carries, at most: the latest ones (providers cap a request's images
#: near this); older ones are named in text instead.
MAX_REQUEST_IMAGES = 32
#: The command that forces a compaction.
COMPACT_COMMAND: Final = "/compact"
#: What a compaction's summary is introduced with in later requests.
SUMMARY_PREFIX: Final = "A summary of the earlier part of this conversation:\n\n"

_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")


def wanted_images(items: Sequence[TimelineItem], prompt: Sequence[ImageRef]) -> list[ImageRef]:
    """The images a request carries: the latest ``MAX_REQUEST_IMAGES`` of the history's user
    messages and the prompt, each hash once."""
    wanted: dict[str, ImageRef] = {}
    every = [image for item in items if item.kind is ItemKind.USER for image in item.images]
    for image in reversed([*every, *prompt]):
        if len(wanted) >= MAX_REQUEST_IMAGES:
            break
        wanted.setdefault(image.sha256, image)
    return list(wanted.values())


def runs_of(items: Sequence[TimelineItem]) -> list[tuple[str | None, list[TimelineItem]]]:
    """``items`` cut into the runs they came from (consecutive rows of one ``run_id``)."""
    runs: list[tuple[str | None, list[TimelineItem]]] = []
    for item in items:
        if runs and runs[-1][0] == item.run_id:
            runs[-1][1].append(item)
        else:
            runs.append((item.run_id, [item]))
    return runs


def encode_transcript(kind: str, messages: Sequence[Any]) -> bytes:
    """A run's messages after its user message, as this engine sent them, for
    ``Turn.keep_transcript``."""
    return orjson.dumps({"format": kind, "messages": list(messages)})


def decode_transcript(body: bytes, kind: str) -> list[Any] | None:
    """The messages of a transcript of format ``kind``; ``None`` for another engine's or a
    damaged one (the run is then rebuilt from its rows)."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(value) is not dict or value.get("format") != kind:
        return None
    messages = value.get("messages")
    if type(messages) is not list or not all(type(m) is dict for m in messages):
        return None
    return messages


async def kept_transcripts(
    turn: Turn, history: Sequence[TimelineItem], kind: str
) -> dict[str, list[Any]]:
    """The transcripts of format ``kind`` kept for the runs of ``history``, by run id."""
    runs = {item.run_id for item in history if item.run_id is not None}
    if not runs:
        return {}
    found = {}
    for run_id, body in (await turn.transcripts()).items():
        if run_id in runs:
            messages = decode_transcript(body, kind)
            if messages is not None:
                found[run_id] = messages
    return found


def tool_name(name: str) -> str:
    """A name a provider accepts for a function (history may hold any host's tool names)."""
    cleaned = _TOOL_NAME.sub("_", name)[:64]
    return cleaned or "tool"


def tool_outcome(tool: ToolState) -> str:
    """What a later request tells the model of a tool call rebuilt from its row."""
    text = tool.output_text
    if text is None:
        text = f"the tool call ended {tool.status.value}"
    return bound_result(text)


def bound_result(text: str) -> str:
    if len(text) <= MAX_TOOL_RESULT_CHARS:
        return text
    return (
        text[:MAX_TOOL_RESULT_CHARS]
        + f"\n[cut: {len(text) - MAX_TOOL_RESULT_CHARS} more characters]"
    )


def after_compaction(items: Sequence[TimelineItem]) -> tuple[str | None, list[TimelineItem]]:
    """The latest compaction's summary and the history a request still carries besides it:
    the rows from the user message of the turn it happened in (its recent part) on, without
    the compaction row. No compaction: ``(None, items)``. ``/compact`` commands are not
    carried: they were the user's to the agent, not to the model."""
    latest = max(
        (i for i, item in enumerate(items) if item.kind is ItemKind.COMPACTION), default=None
    )
    kept = list(items)
    summary = None
    if latest is not None:
        summary = items[latest].text
        start = max((i for i in range(latest) if items[i].kind is ItemKind.USER), default=latest)
        kept = [item for item in items[start:] if item.kind is not ItemKind.COMPACTION]
    return summary, [
        item
        for item in kept
        if not (item.kind is ItemKind.USER and item.text.strip() == COMPACT_COMMAND)
    ]
