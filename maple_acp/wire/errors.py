"""JSON-RPC error codes and the one exception that carries a protocol error: a small public
module, so the rpc layer takes them from here rather than from a private part of ``wire``.

Both the wire layer (a params structuring failure is ``INVALID_PARAMS``) and the rpc peer
(envelopes, unknown methods, cancellation) raise :class:`ProtocolError`; the edge maps runtime
rejections onto the same codes in one place.
"""

from __future__ import annotations

from typing import Any, Final

from maple_acp._exceptions import MapleAcpError
from maple_acp._text import MAX_MESSAGE_CHARS, one_line

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
RESOURCE_NOT_FOUND: Final = -32002  # ACP: unknown or not-owned session
REQUEST_CANCELLED: Final = -32800  # ACP: answer to a request cancelled by $/cancel_request

#: Every error message that crosses the protocol is at most this long (docs/protocol.md).
MAX_ERROR_MESSAGE_CHARS: Final = MAX_MESSAGE_CHARS


def bounded_message(text: str, *, limit: int = MAX_ERROR_MESSAGE_CHARS) -> str:
    """``text`` as one non-empty line of at most ``limit`` characters (see ``one_line``)."""
    return one_line(text, limit)


class ProtocolError(MapleAcpError):
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
