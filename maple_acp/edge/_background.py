"""``_session/background``: a client lists a session's background commands and stops one.

The commands are the lease's (``SessionLease.background_commands``); this flow only checks
the request and shapes the answer. Errors: an unknown session is ``-32002``; a ``stop``
without a handle, or with one the session never gave, is ``-32602`` naming the field.
"""

from __future__ import annotations

from maple_acp.edge._sessions import SessionTable
from maple_acp.wire import (
    INVALID_PARAMS,
    BackgroundCommand,
    BackgroundRequest,
    BackgroundResponse,
    ProtocolError,
)

#: A handle echoed in a refusal, at most (handles we give are short).
MAX_ECHOED_HANDLE_CHARS = 40


class BackgroundFlow:
    """``_session/background`` for one connection's sessions."""

    def __init__(self, table: SessionTable) -> None:
        self._table = table

    async def control(self, request: BackgroundRequest) -> BackgroundResponse:
        lease = self._table.live(request.session_id).lease
        with lease.operation():
            if request.action == "list":
                return BackgroundResponse(
                    commands=tuple(
                        BackgroundCommand(
                            handle=info.handle,
                            command=info.command,
                            status=info.status,
                            exit_code=info.exit_code,
                        )
                        for info in lease.background_commands()
                    )
                )
            handle = request.handle
            if handle is None:
                raise ProtocolError(INVALID_PARAMS, "handle: stop names the command to stop")
            try:
                lease.stop_background(handle)
            except KeyError:
                shown = handle[:MAX_ECHOED_HANDLE_CHARS]
                raise ProtocolError(
                    INVALID_PARAMS, f"handle: no background command {shown!r} in this session"
                ) from None
            return BackgroundResponse()
