"""The MCP SDK's log lines about a stream we closed ourselves are not errors.

When a call's caller is cancelled (a turn cancelled, a lease revoked) while the server is still
sending that call's answer as server-sent events, the SDK's transport fails to hand the event to
the closed reader and logs the failure at ERROR with a traceback, as if the server had sent
something unparseable. For the host that is the expected end of a cancelled call, so the record
is lowered to DEBUG: a log watcher (or an operator) never mistakes it for a fault. A real parse
failure (any other exception) keeps its level.

Resource handling: one filter object, added once to the SDK's transport logger.
Error handling: the filter never raises; a record it does not recognise passes unchanged.
"""

from __future__ import annotations

import logging
from typing import Final

import anyio

#: The SDK logger whose records the filter adjusts.
SDK_TRANSPORT_LOGGER: Final = "mcp.client.streamable_http"

#: Exceptions that only mean "our side of the stream was already closed".
_CLOSED_STREAM_ERRORS: Final = (anyio.BrokenResourceError, anyio.ClosedResourceError)


class ClosedStreamRecords(logging.Filter):
    """Lowers the SDK's records about handing an event to a closed stream to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.exc_info:
            error = record.exc_info[1]
            if isinstance(error, _CLOSED_STREAM_ERRORS):
                record.levelno = logging.DEBUG
                record.levelname = logging.getLevelName(logging.DEBUG)
                # The logger checked the level before the filter ran: decide again for DEBUG.
                return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def install() -> None:
    """Add the filter to the SDK's transport logger (once per process)."""
    sdk_logger = logging.getLogger(SDK_TRANSPORT_LOGGER)
    if not any(isinstance(f, ClosedStreamRecords) for f in sdk_logger.filters):
        sdk_logger.addFilter(ClosedStreamRecords())
