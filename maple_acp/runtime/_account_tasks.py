"""The signed-in account's stored tasks as a caller without a lease sees them: one task by id,
the list, a task's history, a durable delete."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from maple_acp.model import TaskPolicy, TaskQuery, TaskRecord, TimelineItem
from maple_acp.runtime._admission import AdmissionFence, ProjectRoots
from maple_acp.runtime._errors import CHILD_SESSION_MESSAGE, RejectionKind, RuntimeRejection
from maple_acp.runtime._history import replay_view
from maple_acp.runtime._registry import LeaseRegistry
from maple_acp.runtime._replies import TaskListing
from maple_acp.runtime._sweep import ProvisionalSweep
from maple_acp.store import InvalidCursor, TaskStore

logger = logging.getLogger(__name__)

#: A task list page, at most.
MAX_LIST_PAGE = 100


class AccountTasks:
    """Each read is fenced: it is for the account of the generation it was admitted under,
    and answers nothing once the account changed meanwhile."""

    def __init__(
        self,
        *,
        store: TaskStore,
        fence: AdmissionFence,
        roots: ProjectRoots,
        leases: LeaseRegistry,
        sweep: ProvisionalSweep,
    ) -> None:
        self._store = store
        self._fence = fence
        self._roots = roots
        self._leases = leases
        self._sweep = sweep

    async def own(self, generation: int, task_id: str) -> TaskRecord:
        """The account's task by id (``TASK_NOT_FOUND``, ``WRONG_ACCOUNT``)."""
        task = await self._store.get_task(task_id)
        account = self._fence.account_of(generation)
        if task is None:
            raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "no such session")
        if task.account != account:
            raise RuntimeRejection(RejectionKind.WRONG_ACCOUNT, "no such session")
        return task

    async def has(self, task_id: str) -> bool:
        try:
            generation = self._fence.admit()
            await self.own(generation, task_id)
        except RuntimeRejection:
            return False
        return True

    async def listing(
        self, *, cwd: str | None, cursor: str | None, limit: int, allowed_roots: Sequence[str]
    ) -> TaskListing:
        generation = self._fence.admit()
        root = None
        if cwd is not None:
            root = await self._roots.admit_filter(cwd, allowed_roots)
            if root is None:
                self._fence.check(generation)
                return TaskListing(tasks=(), next_cursor=None)
        account = self._fence.account_of(generation)
        query = TaskQuery(
            account=account,
            root=root,
            policy=TaskPolicy.CALLER_MEDIATED,
            cursor=cursor,
            limit=max(1, min(limit, MAX_LIST_PAGE)),
        )
        try:
            page = await self._store.list_tasks(query)
        except InvalidCursor as exc:
            raise RuntimeRejection(RejectionKind.INVALID_CURSOR, "the cursor is not valid") from exc
        self._fence.check(generation)
        tasks = tuple(t for t in page.tasks if self._roots.admits(t.root, allowed_roots))
        return TaskListing(tasks=tasks, next_cursor=page.next_cursor)

    async def history(
        self, task_id: str, allowed_roots: Sequence[str] | None
    ) -> list[TimelineItem]:
        generation = self._fence.admit()
        task = await self.own(generation, task_id)
        if allowed_roots is not None and (
            task.policy is not TaskPolicy.CALLER_MEDIATED
            or not self._roots.admits(task.root, allowed_roots)
        ):
            raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "no such session")
        items = await self._store.history(task_id)
        self._fence.check(generation)
        return replay_view(items)

    async def delete(self, task_id: str) -> None:
        generation = self._fence.admit()
        async with self._sweep.lock:
            task = await self._store.get_task(task_id)
            account = self._fence.account_of(generation)
            if task is None or task.account != account:
                raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "no such session")
            if task.parent_id is not None:
                raise RuntimeRejection(RejectionKind.CHILD_SESSION, CHILD_SESSION_MESSAGE)
            self._leases.check_free(task_id)
            await self._store.delete_task(task_id)
        # Its child sessions went with it (the store deletes them with their parent).
        logger.info("task %s deleted", task_id)
