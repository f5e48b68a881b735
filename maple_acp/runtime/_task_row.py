"""The task row as one lease holds it: the record the lease last saw, shared by its parts, and
what decides the row's fate when the lease ends."""

from __future__ import annotations

import logging

from maple_acp.model import TaskRecord, TaskSurface
from maple_acp.runtime._context import LeaseContext
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection

logger = logging.getLogger(__name__)


class TaskRow:
    """The task as the lease last saw it. Every part of the lease that writes the row (its
    settings, its turns, a re-attach) hands the store's answer here, so they all see one
    record and the provisional row follows every write."""

    def __init__(self, task: TaskRecord, *, created_here: bool, history_locked: bool) -> None:
        self.record = task
        self.provisional = ProvisionalRow(task, created_here=created_here)
        #: The task's history holds a user message although the task is still provisional (a
        #: fork of a prompted session): its model is as locked as its source's.
        self._history_locked = history_locked

    @property
    def model_locked(self) -> bool:
        return self.provisional.prompted or self._history_locked

    def rewritten(self, record: TaskRecord | None) -> TaskRecord:
        """The lease wrote the row; ``None`` (the store found no row) is ``TASK_NOT_FOUND``."""
        if record is None:
            raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "the session is gone")
        self.record = record
        self.provisional.rewritten(record)
        return record

    def admitted(self, record: TaskRecord) -> None:
        """The row after a user message was admitted: the task is no longer provisional."""
        self.record = record
        self.provisional.admitted()

    def retitled(self, record: TaskRecord) -> None:
        """The runtime titled the task (a turn's doing, not the lease holder's write)."""
        self.record = record


class ProvisionalRow:
    """What decides the fate of a task's row when its lease ends: a close deletes a task
    never prompted, if the row is exactly as the lease last wrote it (whether this lease
    created it or loaded it: clients create a session in one process and use it from
    another); a disconnect starts the grace period of a task that is still provisional."""

    def __init__(self, task: TaskRecord, *, created_here: bool) -> None:
        self.task_id = task.id
        self.surface = task.surface
        self.created_here = created_here
        # The row as this lease last wrote it; deletion needs it to be unchanged.
        self._snapshot: TaskRecord | None = task if task.provisional else None
        self._prompted = not task.provisional

    @property
    def prompted(self) -> bool:
        return self._prompted

    def rewritten(self, record: TaskRecord) -> None:
        """The lease wrote the row (e.g. its model) before the first prompt."""
        if self._snapshot is not None:
            self._snapshot = record

    def admitted(self) -> None:
        """The first user message was admitted: the task is no longer provisional."""
        self._prompted = True
        self._snapshot = None

    async def settle(self, context: LeaseContext, *, close: bool) -> None:
        # Only this lease's first admitted message ends the row's provisional state while it
        # holds the task, so a durable task costs no store call (a connection's end settles
        # hundreds of rows at once). The writes below re-check the row themselves: a missing
        # or durable row is left exactly as it is.
        if self._prompted or self.surface is not TaskSurface.EXTERNAL:
            return
        store = context.store
        grace = context.provisional_grace_ms
        snapshot = self._snapshot
        # A grace of 0 deletes on disconnect only what this lease created (the seed's rule);
        # a close ends an untouched task whoever holds it.
        deletable = close or (grace == 0 and self.created_here)
        if snapshot is not None and deletable and await store.delete_task_if_unchanged(snapshot):
            logger.debug("deleted untouched provisional task %s", self.task_id)
            return
        await store.set_provisional_expiry(self.task_id, context.now_ms() + grace)
