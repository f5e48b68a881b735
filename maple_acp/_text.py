"""Bounded text: the one way every layer cuts text that crosses the protocol, a log or the
store, with a visible marker saying it was cut.

Private, pure and below every layer (wire, runtime, mcp and edge each use it), so the rule
lives in one place while the layers still import nothing of each other. There is one marker
per purpose, each named here, so that a reader (or a test) can tell what kind of cut it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

#: The error contract (docs/protocol.md): every message is at most this long.
MAX_MESSAGE_CHARS: Final = 500

#: Ends a one-line message (an error, a notice, a log field) that was cut.
CUT_LINE: Final = "…"
#: Ends tool or message text that was cut (what the client sees, what the store keeps).
CUT_TEXT: Final = "\n… [truncated]"
#: Ends one side of a file diff that was cut.
CUT_DIFF: Final = "\n… [diff truncated]"


def truncate(
    text: str, limit: int, marker: str, *, trim: Callable[[str], str] | None = None
) -> str:
    """``text`` itself if it has at most ``limit`` characters; otherwise its start followed by
    ``marker``, ``limit`` characters in all (just the marker's end if the marker alone is
    longer than ``limit``). ``trim``, when given, may shorten the kept start before the marker
    is added (a relay redactor drops there what the cut left of a secret)."""
    if len(text) <= limit:
        return text
    if len(marker) >= limit:
        return marker[len(marker) - limit :] if limit > 0 else ""
    kept = text[: limit - len(marker)]
    return (trim(kept) if trim is not None else kept) + marker


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` as one non-empty line of at most ``limit`` characters.

    C0 and C1 control characters (newlines included) become spaces, so a message can never
    break a frame or forge a log line; runs of whitespace collapse; an over-long line is cut
    and ends with ``CUT_LINE``.
    """
    line = "".join(" " if (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0) else ch for ch in text)
    line = " ".join(line.split())
    if not line:
        line = "error"
    return truncate(line, limit, CUT_LINE)
