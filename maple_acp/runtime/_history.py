"""A task's history as callers and backends see it."""

from __future__ import annotations

import attrs

from maple_acp._text import one_line
from maple_acp.model import ItemKind, MessageRow, TimelineItem

#: A title the runtime gives an untitled task, at most (session lists show one short line).
MAX_AUTO_TITLE_CHARS = 80


def _replayed(item: TimelineItem) -> TimelineItem:
    """An ended tool row shows its terminal output text; any other row is itself."""
    tool = item.tool
    if tool is None or item.kind is not ItemKind.TOOL:
        return item
    if tool.status.terminal and tool.output_text:
        return attrs.evolve(item, text=tool.output_text)
    return item


def replay_view(items: list[TimelineItem]) -> list[TimelineItem]:
    """History as it is replayed: an ended tool row shows its terminal output text."""
    return [_replayed(item) for item in items]


def replay_rows_view(rows: list[TimelineItem | MessageRow]) -> list[TimelineItem | MessageRow]:
    """``replay_view`` of rows as a store reads them for a replay (message rows pass as
    they are); changes ``rows`` in place and returns it."""
    for index, row in enumerate(rows):
        if not isinstance(row, MessageRow):
            rows[index] = _replayed(row)
    return rows


def title_from_history(items: list[TimelineItem]) -> str | None:
    """The title an untitled task gets when a prompt run ends: the first non-blank line of
    its first user message, one line of at most ``MAX_AUTO_TITLE_CHARS``."""
    first = next((item for item in items if item.kind is ItemKind.USER), None)
    if first is None:
        return None
    line = next((line for line in first.text.splitlines() if line.strip()), "")
    return one_line(line, MAX_AUTO_TITLE_CHARS) if line else None
