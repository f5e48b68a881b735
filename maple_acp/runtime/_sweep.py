"""The provisional sweep: never-prompted tasks whose grace period ended are deleted (at start-up
every stranded one, then every ``PROVISIONAL_SWEEP_INTERVAL_S``), and their ids remembered so a
client coming back for one hears that it expired."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from maple_acp.model import TaskRecord
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.store import TaskStore

logger = logging.getLogger(__name__)

#: How often expired, untouched provisional tasks are swept.
PROVISIONAL_SWEEP_INTERVAL_S = 60.0
#: Swept never-prompted session ids remembered to say "expired" rather than "unknown": a
#: client comes back for a handful, and 1,024 ids are a few tens of KiB.
MAX_REMEMBERED_EXPIRED = 1024


class ProvisionalSweep:
    """Sweeps one service's provisional tasks. ``lock`` orders a sweep against whoever must
    see a task that is not being deleted under it (an attach, a delete)."""

    def __init__(self, *, store: TaskStore, now_ms: Callable[[], int], grace_ms: int) -> None:
        self._store = store
        self._now_ms = now_ms
        self._grace_ms = grace_ms
        self.lock = trio.Lock()
        #: Never-prompted tasks the sweeps deleted, oldest first (see ``_remember``).
        self._expired: dict[str, None] = {}

    async def at_start(self) -> None:
        """Delete the provisional tasks a previous host left behind (stranded: no lease)."""
        deleted = await self._store.sweep_provisional(now_ms=self._now_ms(), stranded=True)
        if deleted:
            logger.info("start-up sweep deleted %d stranded provisional tasks", len(deleted))
            self._remember(deleted)

    async def sweep(self) -> list[str]:
        async with self.lock:
            deleted = await self._store.sweep_provisional(now_ms=self._now_ms(), stranded=False)
        self._remember(deleted)
        return deleted

    async def sweep_periodically(self) -> None:
        """Sweep every ``PROVISIONAL_SWEEP_INTERVAL_S`` until cancelled; a failing sweep is
        logged and tried again at the next interval."""
        while True:
            await trio.sleep(PROVISIONAL_SWEEP_INTERVAL_S)
            try:
                await self.sweep()
            except Exception:
                logger.warning("provisional sweep failed", exc_info=True)

    def check_found(self, task_id: str, found: TaskRecord | None) -> None:
        """Raise "expired" for a task the store no longer has that a sweep deleted."""
        if found is None and task_id in self._expired:
            grace = self._grace_ms / 1000
            raise RuntimeRejection(
                RejectionKind.TASK_NOT_FOUND,
                f"session {task_id} expired before its first prompt",
                detail=(
                    f"a session that was never prompted is kept {grace:.0f} s after its client "
                    "disconnects, then deleted; the host's grace setting (serve --grace) sets "
                    "how long"
                ),
            )

    def _remember(self, task_ids: list[str]) -> None:
        """Keep the ids of swept never-prompted tasks (the newest ones), so a client coming
        back for one learns that it expired rather than that it never existed."""
        for task_id in task_ids:
            self._expired[task_id] = None
        while len(self._expired) > MAX_REMEMBERED_EXPIRED:
            del self._expired[next(iter(self._expired))]
