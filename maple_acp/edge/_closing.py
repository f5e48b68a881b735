"""Closing sessions: ``session/close``, ``session/delete``, a lease the runtime revoked on its
own, and the release of every lease when the connection ends.

``session/close`` gives cancellation, the session's operation barrier and lease cleanup one
shared deadline (:data:`CLOSE_DEADLINE_S`). If any phase misses it the lease is revoked at
once, a tombstone keeps the session id from being republished until the connection ends, the
close is answered anyway and cleanup goes on in the background.

Many leases end together when the connection ends (up to the session cap): they are all
revoked at once, synchronously, but released :data:`RELEASE_GROUP` at a time, one group after
the other, so the scheduler and the store's queue hold only a little of the release at any
moment and other connections' requests keep answering meanwhile. A lease the runtime revoked
on its own joins the same queue.

Resource handling: the queue is drained by one releaser task in the connection's nursery, or
by :meth:`SessionCloser.release_all` at the connection's end; the connection's cleanup bound
cancels whatever is left, and each lease's own cleanup (bounded, in its own task) runs anyway.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Final

import trio

from maple_acp.edge._session import EdgeSession
from maple_acp.edge._sessions import SessionTable
from maple_acp.rpc import admitted
from maple_acp.runtime import AgentService, RejectionKind, RuntimeRejection, SessionLease
from maple_acp.wire import (
    CloseSessionRequest,
    CloseSessionResponse,
    DeleteSessionRequest,
    DeleteSessionResponse,
)

logger = logging.getLogger(__name__)

#: Runtime answers meaning the account has no such task: a delete of it is already done.
_ABSENT: Final = frozenset({RejectionKind.TASK_NOT_FOUND, RejectionKind.WRONG_ACCOUNT})

#: One deadline for cancel + operation barrier + lease cleanup on close (the five-second
#: rule, docs/protocol.md).
CLOSE_DEADLINE_S: Final = 5.0
#: Leases released together when many end at once: enough to keep the whole release well
#: inside the cleanup bound, few enough that another connection's request never waits long.
RELEASE_GROUP: Final = 16
#: How long the next group waits for a slow one (a child ignoring SIGTERM has a 2 s grace):
#: its leases go on cleaning up alone, and a full queue still starts within ~1.6 s.
RELEASE_GROUP_PATIENCE_S: Final = 0.1


class SessionCloser:
    """The ways a session ends on one connection. ``nursery`` is the connection's (where cleanup
    goes on in the background); ``ending`` tells whether the connection is ending
    (the client finished sending, or the transport ended)."""

    def __init__(
        self,
        table: SessionTable,
        runtime: AgentService,
        *,
        nursery: trio.Nursery,
        ending: Callable[[], bool],
    ) -> None:
        self._table = table
        self._runtime = runtime
        self._nursery = nursery
        self._ending = ending
        #: Revoked leases waiting for their release, oldest first.
        self._unreleased: deque[SessionLease] = deque()
        #: Set while no releaser drains ``_unreleased``.
        self._drained = trio.Event()
        self._drained.set()

    async def close(self, request: CloseSessionRequest) -> CloseSessionResponse:
        session = self._table.live(request.session_id)
        # Closing from here on: a request about the session after this one finds it closing.
        session.begin_close()
        admitted()
        await self._close(session)
        logger.info("session %s closed", session.id)
        return CloseSessionResponse()

    async def _close(self, session: EdgeSession) -> bool:
        """Close ``session`` under the close rules; True if its cleanup finished in time. A
        session this connection only observes is detached: its holder keeps it."""
        session.begin_close()
        if session.observer is not None:
            session.observer.detach()
            session.stop_updates()
            self._table.remove(session)
            return True
        deadline = trio.current_time() + CLOSE_DEADLINE_S
        finished = False
        with trio.move_on_at(deadline):
            session.lease.cancel_run()
            await session.lease.drain()
            await session.lease.release(close=True)
            finished = True
        # Nothing for this session may follow the close answer.
        session.stop_updates()
        self._table.remove(session, tombstone=not finished)
        if not finished:
            logger.warning("close of session %s missed its deadline; revoking", session.id)
            session.lease.revoke("the close deadline passed")
            # release() asks the lease's task to clean up; it goes on without us.
            self._nursery.start_soon(partial(session.lease.release, close=True))
        return finished

    async def delete(self, request: DeleteSessionRequest) -> DeleteSessionResponse:
        """Delete a task durably. A session this connection holds is closed first (the close
        rules); the runtime refuses a task another lease holds or that has a run or goal
        cycle going. An id the account has no task for (unknown, already deleted, another
        account's) answers ``{}`` too: delete is idempotent, and no existence oracle."""
        task_id = request.session_id
        session = self._table.get(task_id)
        if session is not None and session.observer is not None:
            # Another connection holds it: refused as for any held session, still followed.
            raise RuntimeRejection(RejectionKind.TASK_LEASED, "the session is open elsewhere")
        if session is not None and not session.closing:
            # Before the close, which would cancel the run the delete must refuse: nothing is
            # closed or deleted while one runs (RUN_ACTIVE, -32600).
            self._runtime.check_idle(task_id)
            # The close rules may have deleted it already (created here, never prompted).
            await self._close(session)
        try:
            await self._runtime.delete_task(task_id)
        except RuntimeRejection as exc:
            if exc.kind not in _ABSENT:
                raise
            logger.info("session %s: nothing to delete", task_id)
            return DeleteSessionResponse()
        logger.info("session %s deleted", task_id)
        return DeleteSessionResponse()

    def forget(self, session: EdgeSession) -> None:
        """The runtime revoked the lease on its own (sign-out, account change, drain): the
        session is gone for this connection; its cleanup goes on in the background."""
        if session.closing or not self._table.holds(session):
            return
        if self._ending():
            logger.info("session %s closed: connection ended", session.id)
        else:
            logger.info("session %s was revoked by the runtime", session.id)
        session.stop_updates()
        self._table.remove(session)
        self._unreleased.append(session.lease)
        if self._drained.is_set():
            # Marked before the releaser runs: the other leases revoked in this same pass
            # join its queue instead of starting releasers of their own.
            self._drained = trio.Event()
            self._nursery.start_soon(self._release_queued)

    async def release_all(self) -> None:
        """The connection ended: release every lease (each already revoked), a group at a
        time; return once every release began. A slow one goes on cleaning up in its own
        task, which the connection's nursery still waits for."""
        self._unreleased.extend(
            session.lease for session in self._table.take_all() if session.observer is None
        )
        if self._drained.is_set():
            self._drained = trio.Event()
            await self._release_queued()
        else:
            await self._drained.wait()

    async def _release_queued(self) -> None:
        """Release the queued leases, :data:`RELEASE_GROUP` at a time, each group waited for
        at most :data:`RELEASE_GROUP_PATIENCE_S`. Only one runs at a time: whoever starts it
        clears ``_drained`` first.

        Cancellation: leaving early (the group's patience, the connection's cleanup bound)
        stops only the waiting; a lease whose release began cleans up in its own task."""
        try:
            while self._unreleased:
                group = self._unreleased
                if len(group) > RELEASE_GROUP:
                    group = deque(group.popleft() for _ in range(RELEASE_GROUP))
                else:
                    self._unreleased = deque()
                with trio.move_on_after(RELEASE_GROUP_PATIENCE_S):
                    async with trio.open_nursery() as nursery:
                        for lease in group:
                            nursery.start_soon(partial(lease.release, close=False))
        finally:
            self._drained.set()
