"""A re-attach: the lease's holder comes back with another set of external tools (and, on a
resume, another set of directories), swapped in while no run is going."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._lease_life import LeaseGuard, RouterFactory
from maple_acp.runtime._task_row import TaskRow
from maple_acp.store import TaskStore


class Reattachment:
    """Swaps what is attached to a lease: its router (the new one connects first; a failure
    keeps the old) and its additional directories. No goal cycle starts while a swap is under
    way (``swapping``).

    Hooks: ``busy`` (a prompt holds the slot or a run is active), ``swap_router`` (the
    lifetime's: start the new router in the lease's nursery, then drop the old) and ``poke``
    (a goal cycle may be due once the swap ends)."""

    def __init__(
        self,
        *,
        row: TaskRow,
        guard: LeaseGuard,
        store: TaskStore,
        busy: Callable[[], bool],
        swap_router: Callable[[RouterFactory | None], Awaitable[None]],
        poke: Callable[[], None],
    ) -> None:
        self._row = row
        self._guard = guard
        self._store = store
        self._busy = busy
        self._swap_router = swap_router
        self._poke = poke
        self.swapping = False

    async def replace_router(
        self, router_factory: RouterFactory | None, directories: Sequence[str] | None
    ) -> None:
        with self._guard.operation():
            if self._busy() or self.swapping:
                raise RuntimeRejection(RejectionKind.RUN_ACTIVE, "a run is active in the session")
            self.swapping = True
            try:
                await self._swap_router(router_factory)
                if directories is not None:
                    await self._store_directories(directories)
            finally:
                self.swapping = False
                self._poke()

    async def _store_directories(self, directories: Sequence[str]) -> None:
        if frozenset(directories) == frozenset(self._row.record.additional_directories):
            return
        self._row.rewritten(
            await self._store.set_task_directories(self._row.record.id, tuple(directories))
        )
        self._guard.check_live()
