"""Bounds applied to everything the runtime hands the edge before it crosses the protocol.

Tool text, raw tool input/output and error text all come from places the client does not
control (models, tools, MCP servers); each has a fixed ceiling so one turn cannot send an
unbounded frame.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Final

import orjson

from maple_acp._text import CUT_TEXT, truncate
from maple_acp.model import ToolLocation
from maple_acp.wire import ToolCallLocation, ToolKind

#: Tool and message text per update: longer text is cut with a marker (docs/limits.md).
MAX_TOOL_TEXT_CHARS: Final = 16_000
#: Encoded size of a raw tool input or output; larger values become a truncation marker.
MAX_RAW_BYTES: Final = 64 * 1024
#: Marker appended to text cut at :data:`MAX_TOOL_TEXT_CHARS` (the one truncation helper's).
TRUNCATION_SUFFIX: Final = CUT_TEXT


def bound_text(text: str, limit: int = MAX_TOOL_TEXT_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters, marked when cut."""
    return truncate(text, limit, CUT_TEXT)


def bound_raw(value: Any, limit: int = MAX_RAW_BYTES) -> Any:
    """``value`` itself if its JSON encoding fits in ``limit`` bytes, else a marker
    ``{"truncated": true, "encodedBytes": N}`` (N = the encoded size that did not fit). An
    object that does not fit keeps its small members and has each large one replaced by such a
    marker: a command's ``exitCode`` survives an output too long to send."""
    if value is None:
        return None
    encoded = _encoded(value)
    if encoded is None:
        return {"truncated": True, "unencodable": True}
    if len(encoded) <= limit:
        return value
    if isinstance(value, dict) and value:
        share = limit // (2 * len(value))
        kept: dict[Any, Any] = {}
        for key, item in value.items():
            size = _encoded(item)
            fits = size is not None and len(size) <= share
            kept[key] = item if fits else {"truncated": True, "encodedBytes": len(size or b"")}
        smaller = _encoded(kept)
        if smaller is not None and len(smaller) <= limit:
            return kept
    return {"truncated": True, "encodedBytes": len(encoded)}


def _encoded(value: Any) -> bytes | None:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return None


_KIND_WORDS: Final[tuple[tuple[ToolKind, tuple[str, ...]], ...]] = (
    ("execute", ("shell", "bash", "exec", "command", "terminal", "run")),
    ("delete", ("delete", "remove", "unlink", "rm")),
    ("move", ("move", "rename", "mv")),
    ("edit", ("edit", "write", "patch", "replace", "create", "apply")),
    ("search", ("search", "grep", "find", "glob", "list")),
    ("read", ("read", "view", "open", "cat", "load")),
    ("fetch", ("fetch", "http", "web", "download", "url", "mcp")),
    ("think", ("think", "plan", "reason")),
)


def infer_tool_kind(name: str) -> ToolKind:
    """A best guess of the ACP tool kind from a tool's name (``other`` when unsure).

    Words are matched whole (``read_file`` -> read, ``shell`` -> execute), so that a name that
    merely contains a short word (``thread``) is not misread.
    """
    words = {w for w in "".join(ch if ch.isalnum() else " " for ch in name.lower()).split()}
    for kind, keys in _KIND_WORDS:
        if words.intersection(keys):
            return kind
    return "other"


def tool_locations(locations: Iterable[ToolLocation]) -> tuple[ToolCallLocation, ...]:
    """ACP tool-call locations for the absolute paths among ``locations``. Others are dropped:
    a relative path means nothing to a client that does not know the tool's cwd; a negative
    line is no line at all."""
    return tuple(
        ToolCallLocation(
            path=location.path,
            line=location.line if location.line is not None and location.line >= 0 else None,
        )
        for location in locations
        if os.path.isabs(location.path)
    )
