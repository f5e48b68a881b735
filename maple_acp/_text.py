"""One bounded line of text: what every message crossing the protocol or a log must be.

Private, pure and below every layer (wire, runtime and mcp each use it), so the rule lives in
one place while the layers still import nothing of each other.
"""

from __future__ import annotations

from typing import Final

#: SPEC.md's error contract: every message is at most this long.
MAX_MESSAGE_CHARS: Final = 500


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` as one non-empty line of at most ``limit`` characters.

    C0 and C1 control characters (newlines included) become spaces, so a message can never
    break a frame or forge a log line; runs of whitespace collapse; an over-long line is cut
    and ends with an ellipsis.
    """
    line = "".join(" " if (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0) else ch for ch in text)
    line = " ".join(line.split())
    if not line:
        line = "error"
    if len(line) > limit:
        line = line[: limit - 1] + "…"
    return line
