"""What one lease reads of its task's stored history: the timeline, the replay rows, the
images and idempotency keys it names, and the child sessions' histories."""

from __future__ import annotations

from maple_acp.model import MessageRow, TaskRecord, TimelineItem
from maple_acp.runtime._history import replay_rows_view, replay_view
from maple_acp.runtime._lease_life import LeaseGuard
from maple_acp.store import TaskStore


class LeaseHistory:
    """The stored history of one leased task, read as one operation of the lease each time;
    a lease revoked while the store answered gets ``LEASE_REVOKED``, not the rows."""

    def __init__(self, *, task_id: str, guard: LeaseGuard, store: TaskStore) -> None:
        self._task_id = task_id
        self._guard = guard
        self._store = store

    async def timeline(self) -> list[TimelineItem]:
        with self._guard.operation():
            items = await self._store.history(self._task_id)
            self._guard.check_live()
            return replay_view(items)

    async def image_data(self, sha256: str) -> bytes | None:
        with self._guard.operation():
            data = await self._store.read_blob(sha256)
            self._guard.check_live()
            return data

    async def keyed_message(self, key: str) -> str | None:
        with self._guard.operation():
            message_id = await self._store.keyed_message(self._task_id, key)
            self._guard.check_live()
            return message_id

    async def replay_rows(self) -> list[TimelineItem | MessageRow]:
        with self._guard.operation():
            rows = await self._store.replay_rows(self._task_id)
            self._guard.check_live()
            return replay_rows_view(rows)

    async def children(self) -> list[tuple[TaskRecord, list[TimelineItem | MessageRow]]]:
        with self._guard.operation():
            children = await self._store.children(self._task_id)
            found = [
                (child, replay_rows_view(await self._store.replay_rows(child.id)))
                for child in children
            ]
            self._guard.check_live()
            return found
