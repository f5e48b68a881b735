"""A lease's lifetime: the task that serves it, synchronous revocation, release with bounded
cleanup, and the guard every part of the lease passes (``LeaseGuard``: live, and counted by the
operation barrier)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

import trio

from maple_acp.runtime._barrier import OperationBarrier
from maple_acp.runtime._context import LeaseContext
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._session_events import LeaseRevoked, SessionEvents
from maple_acp.runtime._task_row import ProvisionalRow
from maple_acp.runtime._tools import ExternalToolRouter, ToolContext

logger = logging.getLogger(__name__)

#: Cleanup after a release or revocation: waiting for operations, provisional-task handling
#: and killing children, all within one bound.
LEASE_CLEANUP_BOUND_S = 5.0

#: Called inside the lease's own nursery, with the id of the task the lease holds, before the
#: lease is handed out, so a caller can start a lease-scoped router there (and connect it)
#: before ownership is committed; a router whose servers are told which session they serve
#: learns its id before the caller does.
RouterFactory = Callable[[trio.Nursery, str], Awaitable[ExternalToolRouter | None]]


class LeaseGuard(Protocol):
    """What each part of a lease asks of its life: is the lease still usable, and mark work
    on it as in flight (``drain`` and ``release`` wait for that work)."""

    def check_live(self) -> None:
        """Raises ``LEASE_REVOKED`` and the admission kinds when the lease cannot be used."""

    def operation(self) -> AbstractContextManager[None]:
        """``check_live``, then the work inside is counted by the operation barrier."""


class LeaseLifetime:
    """Serves one lease in its own nursery until released, and revokes it.

    Revocation is synchronous and idempotent: ``on_revoke`` (the lease cancels its run), the
    tool context (relay values and router dropped, children sent SIGTERM), the nursery, and a
    ``LeaseRevoked`` session event. Release then waits for the operation barrier, settles the
    provisional row and reaps children, all within ``LEASE_CLEANUP_BOUND_S``; a caller that
    stops waiting does not stop the cleanup.
    """

    def __init__(
        self,
        *,
        context: LeaseContext,
        generation: int,
        tools: ToolContext,
        events: SessionEvents,
        barrier: OperationBarrier,
        row: ProvisionalRow,
        on_revoke: Callable[[], None],
    ) -> None:
        self._context = context
        self._generation = generation
        self._tools = tools
        self._events = events
        self._barrier = barrier
        self._row = row
        self._on_revoke = on_revoke
        self._nursery: trio.Nursery | None = None
        self._revoked = False
        self._close_requested = False
        self._release_requested = trio.Event()
        self._done = trio.Event()

    @property
    def revoked(self) -> bool:
        return self._revoked

    @property
    def released(self) -> bool:
        return self._done.is_set()

    @property
    def nursery(self) -> trio.Nursery:
        """The lease's own nursery (runs and routers live in it). Only while serving."""
        if self._nursery is None:
            raise RuntimeRejection(RejectionKind.LEASE_REVOKED, "the session is not serving")
        return self._nursery

    def check_live(self) -> None:
        if self._revoked:
            raise RuntimeRejection(RejectionKind.LEASE_REVOKED, "the session was revoked")
        self._context.check_admitted(self._generation)

    def live(self) -> bool:
        return not self._revoked and self._context.admits(self._generation)

    @contextmanager
    def operation(self) -> Iterator[None]:
        self.check_live()
        with self._barrier.operation():
            yield

    def revoke(self, reason: str) -> None:
        if self._revoked:
            return
        self._revoked = True
        self._on_revoke()
        self._tools.revoke()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        self._events.publish(LeaseRevoked(reason))

    async def release(self, *, close: bool) -> None:
        if close and not self._done.is_set():
            self._close_requested = True
        self.revoke("the session was released")
        self._release_requested.set()
        await self._done.wait()

    async def serve(
        self,
        router_factory: RouterFactory | None,
        *,
        main: Callable[[], Awaitable[None]],
        started: Callable[[], None],
        unregister: Callable[[], None],
    ) -> None:
        """Start the router, run ``main`` in the lease's nursery, call ``started`` once the
        lease may be handed out, and serve until released; cleanup runs whatever happens."""
        handed_out = False
        setup_error: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._revoked:
                    nursery.cancel_scope.cancel()
                if router_factory is not None:
                    try:
                        router = await router_factory(nursery, self._row.task_id)
                        self._tools.install_router(router)
                    except Exception as exc:
                        setup_error = exc
                        nursery.cancel_scope.cancel()
                if setup_error is None and not self._revoked:
                    try:
                        self.check_live()
                    except RuntimeRejection as exc:
                        setup_error = exc
                        nursery.cancel_scope.cancel()
                    else:
                        handed_out = True
                        started()
                        # ``main`` runs in this task rather than a task of its own: a
                        # connection's end revokes hundreds of leases in one go, and each
                        # task less is less to unwind in that one scheduler pass.
                        await main()
                        await trio.sleep_forever()
            if setup_error is not None:
                raise setup_error
            if not handed_out:
                raise RuntimeRejection(RejectionKind.LEASE_REVOKED, "the session was revoked")
            await self._release_requested.wait()
        finally:
            if not handed_out:
                # Never handed out: nothing of it can have been used, so clean up as a close.
                self._close_requested = True
            with trio.CancelScope(shield=True):
                with trio.move_on_after(LEASE_CLEANUP_BOUND_S):
                    await self._cleanup()
                self._tools.revoke()
                for pgid in self._tools.live_process_groups:
                    logger.warning("process group %d outlived its lease cleanup", pgid)
                unregister()
                self._events.close()
                self._done.set()

    async def replace_router(self, router_factory: RouterFactory | None) -> None:
        """Start the new router in the lease's nursery first; only once it is up does it
        replace (and revoke) the old one. If it fails, its error propagates and the old router
        stays."""
        router = (
            await router_factory(self.nursery, self._row.task_id)
            if router_factory is not None
            else None
        )
        if self._revoked:
            if router is not None:
                router.revoke()
            raise RuntimeRejection(RejectionKind.LEASE_REVOKED, "the session was revoked")
        self._tools.replace_router(router)

    async def _cleanup(self) -> None:
        self.revoke("the session was released")
        await self._barrier.wait_idle()
        try:
            await self._row.settle(self._context, close=self._close_requested)
        except Exception:
            logger.warning("could not settle provisional task %s", self._row.task_id, exc_info=True)
        await self._tools.reap()
