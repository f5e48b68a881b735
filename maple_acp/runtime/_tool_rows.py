"""The one gate every tool row and permission request passes before it is stored or sent:
relay values redacted, then diffs and locations bounded with a visible marker."""

from __future__ import annotations

import attrs

from maple_acp._text import CUT_DIFF
from maple_acp.model import FileDiff, ToolLocation, ToolState
from maple_acp.runtime._permissions import ToolRequest
from maple_acp.runtime._relay import RelayRedactor

#: Each side of a diff kept in a tool row (the file on disk keeps all of it).
MAX_DIFF_SIDE_CHARS = 64 * 1024
#: Diffs per tool row: a tool that edits more files reports the first ones.
MAX_DIFFS_PER_ROW = 64
#: Locations per tool row.
MAX_LOCATIONS_PER_ROW = 256


def _prepared_diff(diff: FileDiff, redactor: RelayRedactor) -> FileDiff:
    """``diff`` redacted, then each side cut to ``MAX_DIFF_SIDE_CHARS`` (in that order, so
    that no cut leaves a piece of a relay value); ``diff`` itself when nothing changes."""
    new_text, new_cut = redactor.bounded(diff.new_text, MAX_DIFF_SIDE_CHARS, CUT_DIFF)
    old_text, old_cut = diff.old_text, False
    if old_text is not None:
        old_text, old_cut = redactor.bounded(old_text, MAX_DIFF_SIDE_CHARS, CUT_DIFF)
    path = redactor.text(diff.path)
    if (path, new_text, old_text) == (diff.path, diff.new_text, diff.old_text):
        return diff
    return attrs.evolve(
        diff,
        path=path,
        new_text=new_text,
        old_text=old_text,
        truncated=diff.truncated or new_cut or old_cut,
    )


def prepared_tool(tool: ToolState, redactor: RelayRedactor) -> ToolState:
    """``tool`` as it may be stored and sent: every text redacted first, then diffs and
    locations bounded."""
    if redactor:
        tool = attrs.evolve(
            tool,
            title=redactor.text(tool.title),
            raw_input=redactor.value(tool.raw_input),
            raw_output=redactor.value(tool.raw_output),
            # A backend may have cut its output text before handing it over (the cut the
            # runtime cannot redact before): a piece of a value at its end goes too.
            output_text=(
                redactor.without_partial_value(redactor.text(tool.output_text))
                if tool.output_text is not None
                else None
            ),
            locations=tuple(
                attrs.evolve(location, path=redactor.text(location.path))
                for location in tool.locations
            ),
        )
    diffs = tuple(_prepared_diff(diff, redactor) for diff in tool.diffs[:MAX_DIFFS_PER_ROW])
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
