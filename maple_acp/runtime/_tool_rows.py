"""The one gate every tool row and permission request passes before it is stored or sent:
relay values redacted, then diffs and locations bounded with a visible marker."""

from __future__ import annotations

import attrs

from maple_acp._text import CUT_DIFF, truncate
from maple_acp.model import FileDiff, ToolLocation, ToolState
from maple_acp.runtime._permissions import ToolRequest
from maple_acp.runtime._relay import RelayRedactor

#: Each side of a diff kept in a tool row (the file on disk keeps all of it).
MAX_DIFF_SIDE_CHARS = 64 * 1024
#: Diffs per tool row: a tool that edits more files reports the first ones.
MAX_DIFFS_PER_ROW = 64
#: Locations per tool row.
MAX_LOCATIONS_PER_ROW = 256


def _bounded_diff(diff: FileDiff) -> FileDiff:
    new_text = truncate(diff.new_text, MAX_DIFF_SIDE_CHARS, CUT_DIFF)
    old_text = diff.old_text
    if old_text is not None:
        old_text = truncate(old_text, MAX_DIFF_SIDE_CHARS, CUT_DIFF)
    cut = new_text is not diff.new_text or old_text is not diff.old_text
    if not cut:
        return diff
    return attrs.evolve(diff, new_text=new_text, old_text=old_text, truncated=True)


def _redacted_diff(diff: FileDiff, redactor: RelayRedactor) -> FileDiff:
    old_text = diff.old_text
    return attrs.evolve(
        diff,
        path=redactor.text(diff.path),
        new_text=redactor.text(diff.new_text),
        old_text=redactor.text(old_text) if old_text is not None else None,
    )


def prepared_tool(tool: ToolState, redactor: RelayRedactor) -> ToolState:
    """``tool`` as it may be stored and sent."""
    if redactor:
        tool = attrs.evolve(
            tool,
            title=redactor.text(tool.title),
            raw_input=redactor.value(tool.raw_input),
            raw_output=redactor.value(tool.raw_output),
            output_text=redactor.text(tool.output_text) if tool.output_text is not None else None,
            locations=tuple(
                attrs.evolve(location, path=redactor.text(location.path))
                for location in tool.locations
            ),
            diffs=tuple(_redacted_diff(diff, redactor) for diff in tool.diffs),
        )
    diffs = tuple(_bounded_diff(diff) for diff in tool.diffs[:MAX_DIFFS_PER_ROW])
    locations: tuple[ToolLocation, ...] = tool.locations[:MAX_LOCATIONS_PER_ROW]
    if diffs != tool.diffs or len(locations) != len(tool.locations):
        tool = attrs.evolve(tool, diffs=diffs, locations=locations)
    return tool


def prepared_request(request: ToolRequest, redactor: RelayRedactor) -> ToolRequest:
    """A permission request as the caller may see it."""
    if not redactor:
        return request
    return attrs.evolve(
        request, title=redactor.text(request.title), raw_input=redactor.value(request.raw_input)
    )
