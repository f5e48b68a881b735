"""A task's history as callers and backends see it."""

from __future__ import annotations

import attrs

from maple_acp.model import ItemKind, TimelineItem


def replay_view(items: list[TimelineItem]) -> list[TimelineItem]:
    """History as it is replayed: an ended tool row shows its terminal output text."""
    view: list[TimelineItem] = []
    for item in items:
        tool = item.tool
        if (
            item.kind is ItemKind.TOOL
            and tool is not None
            and tool.status.terminal
            and tool.output_text
        ):
            item = attrs.evolve(item, text=tool.output_text)
        view.append(item)
    return view
