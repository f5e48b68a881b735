"""The ``TaskStore`` protocol: what the runtime needs from persistence.

Every method is one logical change and, for the SQLite store, one transaction. Implementations
must never be handed credentials (MCP headers, relay values): the runtime does not pass any, and
none of these records has a field for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from maple_acp._exceptions import MapleAcpError
from maple_acp.model import (
    GoalRecord,
    MessageRow,
    TaskPage,
    TaskQuery,
    TaskRecord,
    TimelineItem,
    Usage,
)


class StoreError(MapleAcpError):
    """A store operation failed (I/O, corruption, a constraint). Never carries row content."""


class InvalidCursor(StoreError):
    """A list cursor that this store did not issue (or for another query)."""


class ForkSourceMissing(StoreError):
    """A fork's source task, or the message its copy ends at, is not stored. ``message`` is
    true when the task exists but the message id does not."""

    def __init__(self, *, message: bool) -> None:
        super().__init__("no such message" if message else "no such task")
        self.message = message


class TaskStore(Protocol):
    # -- tasks -------------------------------------------------------------------------------
    async def create_task(self, task: TaskRecord) -> None:
        """Insert a new task. Raises ``StoreError`` if the id exists."""

    async def get_task(self, task_id: str) -> TaskRecord | None: ...

    async def list_tasks(self, query: TaskQuery) -> TaskPage:
        """Newest ``updated_ms`` first (ties by id), at most ``min(query.limit, 100)`` rows.
        Provisional and archived tasks only when asked for. Raises ``InvalidCursor``."""

    async def rename_task(
        self, task_id: str, title: str, *, user_renamed: bool, now_ms: int
    ) -> TaskRecord | None:
        """Set the title; ``user_renamed`` marks a rename by a person (it protects a
        provisional task from sweeping). Returns the new row, ``None`` if there is no task."""

    async def set_task_model(
        self, task_id: str, model: str | None, *, now_ms: int
    ) -> TaskRecord | None: ...

    async def set_task_mode(self, task_id: str, mode: str | None) -> TaskRecord | None:
        """Store the task's session mode id (``None``: the host's default). A setting, not
        activity: ``updated_ms`` stays. Returns the new row, ``None`` if there is no task."""

    async def set_task_thought_level(self, task_id: str, level: str | None) -> TaskRecord | None:
        """Store the task's thinking effort (``None``: the backend's default), as
        ``set_task_mode`` does."""

    async def set_task_boolean_options(
        self, task_id: str, options: Sequence[tuple[str, bool]]
    ) -> TaskRecord | None:
        """Store the task's boolean options (option id, value), replacing its set, as
        ``set_task_mode`` does."""

    async def set_task_directories(
        self, task_id: str, directories: Sequence[str]
    ) -> TaskRecord | None:
        """Store the task's additional directories (canonical, as admitted), replacing its set,
        as ``set_task_mode`` does. Returns the new row, ``None`` if there is no task."""

    async def set_provisional_expiry(
        self, task_id: str, expires_ms: int | None
    ) -> TaskRecord | None:
        """Start (or clear) the grace period of a provisional task. Does not touch
        ``updated_ms``. No effect on a task that is no longer provisional."""

    async def set_archived(
        self, task_id: str, archived: bool, *, now_ms: int
    ) -> TaskRecord | None: ...

    async def delete_task(self, task_id: str) -> bool:
        """Delete a task with everything that hangs off it (its child sessions too). True if
        a row was deleted."""

    async def delete_task_if_unchanged(self, snapshot: TaskRecord) -> bool:
        """Delete the task only if its row still equals ``snapshot`` exactly, it is still
        provisional, and it has no timeline item — all checked in the same transaction as the
        delete. True if deleted."""

    # -- timeline ----------------------------------------------------------------------------
    async def admit_user_message(
        self,
        task_id: str,
        item: TimelineItem,
        *,
        now_ms: int,
        blobs: Mapping[str, bytes] | None = None,
        idempotency_key: str | None = None,
    ) -> TaskRecord:
        """Durably append a user message and, in the same transaction, end the task's
        provisional state (clearing any grace expiry) and bump ``updated_ms``. Once this
        returns, the message survives a crash. The bytes of ``item.images`` come in ``blobs``
        (by SHA-256) and are stored once per hash, however many messages carry them; a blob
        no stored task refers to any more is dropped when its last task is deleted. With an
        ``idempotency_key``, the same transaction records that the key inserted this message
        (see :meth:`keyed_message`; the task's latest 1,024 keys are kept). Raises
        ``StoreError`` if the task is gone, or an image's bytes are missing or do not match
        its hash."""

    async def keyed_message(self, task_id: str, key: str) -> str | None:
        """The id of the user message ``key`` inserted in ``task_id``, if it is one of the
        task's remembered keys."""

    async def read_blob(self, sha256: str) -> bytes | None:
        """The bytes of a stored image, ``None`` if no task holds it any more."""

    async def upsert_items(
        self, task_id: str, items: Sequence[TimelineItem], *, now_ms: int
    ) -> None:
        """Insert new items (in order, after every existing one) or replace stored ones with
        the same ``run_id`` and ``item_id`` in place (their ``seq`` is kept); the same
        ``item_id`` in another run is another item. For a tool row, a replacement
        whose ``raw_input`` is ``None`` keeps the stored ``raw_input``, and one with no
        ``locations`` or no ``diffs`` keeps the stored ones. Bumps ``updated_ms``."""

    async def history(self, task_id: str) -> list[TimelineItem]:
        """Every item of the task, ordered by ``seq``."""

    async def replay_rows(self, task_id: str) -> list[TimelineItem | MessageRow]:
        """Every item of the task, ordered by ``seq``, for a replay to a client: a message row
        may come as a ``MessageRow``, any row may come whole. ``return await
        self.history(task_id)`` is a correct implementation; the SQLite store reads message rows
        as three columns, which makes the first replay of a long history after a restart
        several times cheaper."""

    async def item_count(self, task_id: str) -> int: ...

    async def fork_task(self, source_id: str, task: TaskRecord, *, up_to: str | None) -> int:
        """Insert ``task`` with a copy of ``source_id``'s items (all of them, or up to and
        including the last row of the message ``up_to``), in one transaction. Returns how many
        items were copied. Raises ``ForkSourceMissing`` (nothing written) when the source or
        the message is not stored, ``StoreError`` if ``task``'s id exists. The source's child
        sessions whose delegating call the copy holds are copied too, under new ids."""

    async def children(self, task_id: str) -> list[TaskRecord]:
        """The child sessions of ``task_id``, in the order they were delegated."""

    async def put_transcript(self, task_id: str, run_id: str, body: bytes) -> None:
        """Keep what a provider engine sent for run ``run_id`` (opaque bytes, replacing an
        earlier one of the run), as covering the run's items stored so far."""

    async def transcripts(self, task_id: str) -> dict[str, bytes]:
        """The kept transcripts of the task's runs, by run id: only those that still cover
        every item of their run."""

    # -- usage -------------------------------------------------------------------------------
    async def record_usage(self, task_id: str, run_id: str, usage: Usage) -> None:
        """Store one run's usage (replacing an earlier record for the same run)."""

    async def run_usage(self, task_id: str, run_id: str) -> Usage | None: ...

    # -- project trust -----------------------------------------------------------------------
    async def get_trust(self, account: str, root: str) -> bool | None:
        """The saved decision for a canonical directory, ``None`` if undecided."""

    async def set_trust(
        self, account: str, root: str, trusted: bool | None, *, now_ms: int
    ) -> None:
        """Save a decision; ``None`` forgets it."""

    # -- goals -------------------------------------------------------------------------------
    async def get_goal(self, task_id: str) -> GoalRecord | None: ...

    async def put_goal(self, task_id: str, goal: GoalRecord | None) -> None:
        """Save the task's goal; ``None`` clears it."""

    # -- sweeps ------------------------------------------------------------------------------
    async def sweep_provisional(self, *, now_ms: int, stranded: bool) -> list[str]:
        """Delete provisional external tasks that were never touched (no item, not renamed by a
        user) and whose grace has expired (``provisional_expires_ms <= now_ms``). With
        ``stranded=True`` (the runtime's start-up sweep) also those with no grace running at
        all, which a crash or a timed-out cleanup left behind. Returns the deleted ids."""

    async def aclose(self) -> None: ...
