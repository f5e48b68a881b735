"""Closing sessions: ``session/close``, ``session/delete``, a lease the runtime revoked on its
own, and the release of every lease when the connection ends.

``session/close`` gives cancellation, the session's operation barrier and lease cleanup one
shared deadline (:data:`CLOSE_DEADLINE_S`). If any phase misses it the lease is revoked at
once, a tombstone keeps the session id from being republished until the connection ends, the
close is answered anyway and cleanup goes on in the background.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Final

import trio

from maple_acp.edge._session import EdgeSession
from maple_acp.runtime import RejectionKind, RuntimeRejection
from maple_acp.wire import (
    INVALID_REQUEST,
    CloseSessionRequest,
    CloseSessionResponse,
    DeleteSessionRequest,
    DeleteSessionResponse,
    ProtocolError,
)

if TYPE_CHECKING:
    from maple_acp.edge._connection import AcpConnection

logger = logging.getLogger(__name__)

#: One deadline for cancel + operation barrier + lease cleanup on close (SPEC.md).
CLOSE_DEADLINE_S: Final = 5.0


class SessionCloser:
    """The ways a session ends on one connection."""

    def __init__(self, connection: AcpConnection) -> None:
        self.connection = connection

    async def close(self, request: CloseSessionRequest) -> CloseSessionResponse:
        session = self.connection.session(request.session_id)
        await self._close(session)
        logger.info("session %s closed", session.id)
        return CloseSessionResponse()

    async def _close(self, session: EdgeSession) -> bool:
        """Close ``session`` under the close rules; True if its cleanup finished in time."""
        connection = self.connection
        session.begin_close()
        deadline = trio.current_time() + CLOSE_DEADLINE_S
        finished = False
        with trio.move_on_at(deadline):
            session.lease.cancel_run()
            await session.lease.drain()
            await session.lease.release(close=True)
            finished = True
        # Nothing for this session may follow the close answer.
        session.stop_updates()
        del connection.sessions[session.id]
        if not finished:
            logger.warning("close of session %s missed its deadline; revoking", session.id)
            session.lease.revoke("the close deadline passed")
            connection.tombstones.add(session.id)
            # release() asks the lease's task to clean up; it goes on without us.
            connection.nursery.start_soon(partial(session.lease.release, close=True))
        return finished

    async def delete(self, request: DeleteSessionRequest) -> DeleteSessionResponse:
        """Delete a task durably. A session this connection holds is closed first (the close
        rules); the runtime refuses a task another lease holds or that has a run or goal
        cycle going, and one that does not exist."""
        connection = self.connection
        task_id = request.session_id
        session = connection.sessions.get(task_id)
        if session is not None and not session.closing:
            if session.lease.active_run is not None:
                raise ProtocolError(INVALID_REQUEST, "the session has a run going")
            # The close rules delete a task this connection created and never prompted.
            untouched = session.lease.created_here and session.lease.task.provisional
            await self._close(session)
            try:
                await connection.runtime.delete_task(task_id)
            except RuntimeRejection as exc:
                if not (untouched and exc.kind is RejectionKind.TASK_NOT_FOUND):
                    raise
        else:
            await connection.runtime.delete_task(task_id)
        logger.info("session %s deleted", task_id)
        return DeleteSessionResponse()

    def forget(self, session: EdgeSession) -> None:
        """The runtime revoked the lease on its own (sign-out, account change, drain): the
        session is gone for this connection; its cleanup goes on in the background."""
        connection = self.connection
        if session.closing or connection.sessions.get(session.id) is not session:
            return
        if connection.ending:
            logger.info("session %s closed: connection ended", session.id)
        else:
            logger.info("session %s was revoked by the runtime", session.id)
        session.stop_updates()
        del connection.sessions[session.id]
        connection.nursery.start_soon(partial(session.lease.release, close=False))

    async def release_all(self) -> None:
        """The connection ended: release every lease (each already revoked), at once."""
        sessions = self.connection.sessions
        async with trio.open_nursery() as nursery:
            for session in list(sessions.values()):
                nursery.start_soon(partial(session.lease.release, close=False))
        sessions.clear()
