"""JSON-RPC error codes and the one exception that carries a protocol error.

Both the wire layer (a params structuring failure is ``INVALID_PARAMS``) and the rpc peer
(envelopes, unknown methods, cancellation) raise :class:`ProtocolError`; the edge maps runtime
rejections onto the same codes in one place.
"""

from __future__ import annotations

from typing import Any, Final

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
RESOURCE_NOT_FOUND: Final = -32002  # ACP: unknown or not-owned session
REQUEST_CANCELLED: Final = -32800  # ACP: answer to a request cancelled by $/cancel_request

#: Every error message that crosses the protocol is at most this long (SPEC.md error contract).
MAX_ERROR_MESSAGE_CHARS: Final = 500


def bounded_message(text: str, *, limit: int = MAX_ERROR_MESSAGE_CHARS) -> str:
    """Return ``text`` as one non-empty line of at most ``limit`` characters.

    Control characters (newlines included) become spaces so a message can never break a frame
    or forge a log line; an over-long message is cut and marked with an ellipsis.
    """
    line = "".join(" " if (ord(ch) < 0x20 or ord(ch) == 0x7F) else ch for ch in text)
    line = " ".join(line.split())
    if not line:
        line = "error"
    if len(line) > limit:
        line = line[: limit - 1] + "…"
    return line


class ProtocolError(Exception):
    """A JSON-RPC error: raised by handlers to answer with it, and by outgoing requests that
    the peer answered with an error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        self.code = code
        self.message = bounded_message(message)
        self.data = data
        super().__init__(f"{code}: {self.message}")

    def to_error_object(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error
