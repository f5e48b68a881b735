"""The SQLite implementation of ``TaskStore``: one file per host data directory.

This module holds the store's lifetime (the data directory's lock, opening, migrating, the one
connection, the worker thread, transactions, closing) and what a delete leaves on disk. What
the rows mean lives in its two halves: ``_tasks`` (task rows, goals, usage, trust, list pages,
sweeps) and ``_history`` (timeline items); the lock lives in ``_lock``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeVar, cast

import trio

from maple_acp.model import (
    GoalRecord,
    ItemKind,
    MessageRow,
    TaskPage,
    TaskQuery,
    TaskRecord,
    TimelineItem,
    Usage,
)
from maple_acp.store import _blobs, _children, _history, _tasks
from maple_acp.store._lock import DataDirectoryLock
from maple_acp.store._migrations import SCHEMA_VERSION, migrate
from maple_acp.store._prompt_keys import message_for_key, remember_key_locked
from maple_acp.store._protocol import ForkSourceMissing, StoreError, TaskStore
from maple_acp.store._tasks import MAX_PAGE

__all__ = ["MAX_PAGE", "SqliteTaskStore"]

logger = logging.getLogger(__name__)

#: How long a writer waits for another process's lock on the file before failing; also how
#: long a delete's checkpoint waits for a reader of an older snapshot (SQLite's busy handler
#: retries within it).
BUSY_TIMEOUT_MS = 5_000

_T = TypeVar("_T")


# -- transactions ----------------------------------------------------------------------------


def _write(conn: sqlite3.Connection, change: Callable[[sqlite3.Connection], _T]) -> _T:
    """Run ``change`` as one transaction. ``BEGIN IMMEDIATE`` takes the write lock up front,
    so a read-then-write change can never fail half-way with a lock upgrade conflict."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = change(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


class SqliteTaskStore:
    """``TaskStore`` over one SQLite file in WAL mode.

    Every call runs on a worker thread through ``trio.to_thread.run_sync``; one connection is
    shared by all calls and a ``CapacityLimiter(1)`` lets exactly one thread use it at a time,
    in the order the calls arrived.

    Resource handling: ``open`` first locks the data directory (``DataDirectoryLock``: an
    ``flock`` on ``<file>.lock``, so one host at a time, and every sweep runs under the lock),
    then creates (or migrates) the file and holds one connection until ``aclose``, which waits
    for the running call, closes the connection, then releases the lock. The store is an async
    context manager that closes itself on exit.

    Deleted text: ``secure_delete`` is on, so a delete overwrites the freed content with
    zeros, and ``delete_task`` / ``delete_task_if_unchanged`` checkpoint the WAL in TRUNCATE
    mode after their commit, before they return: once a delete answered, the task's text is in
    none of the file, its ``-wal`` and its ``-shm``. If the checkpoint cannot complete (another
    process reads an older snapshot for longer than ``BUSY_TIMEOUT_MS``), the delete still
    stands and returns normally; a warning is logged and the text stays in the WAL until the
    next delete's checkpoint or the store's close, which checkpoints and removes the WAL.

    Error handling: SQLite failures surface as ``StoreError`` (without row content); another
    open of the same file (another host on the data directory) is ``DataDirectoryLocked``,
    naming the directory and the holder's PID; a cursor that is not this query's is
    ``InvalidCursor``; programming errors (a page size below 1, a non-user item passed to
    ``admit_user_message``) are ``ValueError``.

    Cancellation: store calls are uncancellable while they run. A call is not abandoned once
    its thread started (``abandon_on_cancel=False``), so a cancelled caller never leaves a
    half-done transaction behind: the call completes, returns (or raises) as usual, and the
    caller meets its cancellation at its next checkpoint. A call still waiting for the
    connection is cancelled at once, without touching the file.
    """

    def __init__(self, conn: sqlite3.Connection, path: str, lock: DataDirectoryLock) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._path = path
        self._lock = lock
        self._limiter = trio.CapacityLimiter(1)
        #: Touched only on the worker thread, under the limiter, like the connection.
        self._histories = _history.HistoryCache()

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    async def open(cls, path: str | os.PathLike[str]) -> SqliteTaskStore:
        """Lock the data directory, then open (creating or migrating) the store at ``path``.
        Raises ``DataDirectoryLocked`` if another open holds the directory, ``StoreError`` if
        the file is not a task store this version can read."""
        fspath = os.fspath(path)
        conn, lock = await trio.to_thread.run_sync(_open, fspath, abandon_on_cancel=False)
        return cls(conn, fspath, lock)

    async def aclose(self) -> None:
        """Close the connection after the running call (if any), then release the data
        directory. Idempotent."""

        def close() -> None:
            conn, self._conn = self._conn, None
            if conn is None:
                return
            try:
                # Keeps the planner's statistics fresh at a moment nobody is waiting.
                conn.execute("PRAGMA optimize")
            except sqlite3.Error:
                logger.debug("PRAGMA optimize failed on close", exc_info=True)
            finally:
                try:
                    conn.close()
                finally:
                    # Only once the file is closed may another host take it.
                    self._lock.release()

        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(close, limiter=self._limiter, abandon_on_cancel=False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def path(self) -> str:
        return self._path

    async def _run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        def call() -> _T:
            conn = self._conn
            if conn is None:
                raise StoreError("the task store is closed")
            try:
                return work(conn)
            except sqlite3.Error as exc:
                raise StoreError(f"task store operation failed ({type(exc).__name__})") from exc

        return await trio.to_thread.run_sync(call, limiter=self._limiter, abandon_on_cancel=False)

    async def _transaction(self, change: Callable[[sqlite3.Connection], _T]) -> _T:
        return await self._run(lambda conn: _write(conn, change))

    # -- tasks -------------------------------------------------------------------------------

    async def create_task(self, task: TaskRecord) -> None:
        await self._transaction(lambda conn: _tasks.insert_task(conn, task))

    async def get_task(self, task_id: str) -> TaskRecord | None:
        return await self._run(lambda conn: _tasks.read_task(conn, task_id))

    async def list_tasks(self, query: TaskQuery) -> TaskPage:
        return await self._run(lambda conn: _tasks.read_page(conn, query))

    async def _update_task(
        self, task_id: str, assignments: str, params: Sequence[object]
    ) -> TaskRecord | None:
        return await self._transaction(
            lambda conn: _tasks.update_task(conn, task_id, assignments, params)
        )

    async def rename_task(
        self, task_id: str, title: str, *, user_renamed: bool, now_ms: int
    ) -> TaskRecord | None:
        # The flag is stored as given: the runtime decides whether an automatic title may
        # follow a person's rename.
        return await self._update_task(
            task_id,
            "title = ?, user_renamed = ?, updated_ms = ?",
            (title, int(user_renamed), now_ms),
        )

    async def set_task_model(
        self, task_id: str, model: str | None, *, now_ms: int
    ) -> TaskRecord | None:
        return await self._update_task(task_id, "model = ?, updated_ms = ?", (model, now_ms))

    async def set_task_mode(self, task_id: str, mode: str | None) -> TaskRecord | None:
        return await self._update_task(task_id, "mode = ?", (mode,))

    async def set_task_thought_level(self, task_id: str, level: str | None) -> TaskRecord | None:
        return await self._update_task(task_id, "thought_level = ?", (level,))

    async def set_task_boolean_options(
        self, task_id: str, options: Sequence[tuple[str, bool]]
    ) -> TaskRecord | None:
        return await self._update_task(
            task_id, "boolean_options = ?", (_tasks.encode_boolean_options(options),)
        )

    async def set_task_directories(
        self, task_id: str, directories: Sequence[str]
    ) -> TaskRecord | None:
        return await self._update_task(
            task_id, "additional_directories = ?", (_tasks.encode_directories(directories),)
        )

    async def set_provisional_expiry(
        self, task_id: str, expires_ms: int | None
    ) -> TaskRecord | None:
        # A durable task has no grace to start: the CASE leaves its row exactly as it was.
        return await self._update_task(
            task_id,
            "provisional_expires_ms = CASE WHEN provisional = 1 THEN ? "
            "ELSE provisional_expires_ms END",
            (expires_ms,),
        )

    async def set_archived(self, task_id: str, archived: bool, *, now_ms: int) -> TaskRecord | None:
        return await self._update_task(
            task_id, "archived = ?, updated_ms = ?", (int(archived), now_ms)
        )

    async def delete_task(self, task_id: str) -> bool:
        def change(conn: sqlite3.Connection) -> bool:
            self._histories.forget(task_id)
            for child in _children.read_children(conn, task_id):
                self._histories.forget(child.id)
            deleted = _tasks.delete_task(conn, task_id)
            _blobs.drop_unreferenced_locked(conn)
            return deleted

        return await self._delete(change)

    async def delete_task_if_unchanged(self, snapshot: TaskRecord) -> bool:
        def change(conn: sqlite3.Connection) -> bool:
            self._histories.forget(snapshot.id)
            deleted = _tasks.delete_task_if_unchanged(conn, snapshot)
            if deleted:
                # A fork's copied rows may name images; its refs went with it.
                _blobs.drop_unreferenced_locked(conn)
            return deleted

        # No checkpoint: an unchanged task was never prompted, so it holds no conversation
        # text, and truncating the WAL after every closed empty session made the next write
        # grow the file again (session/new p50 0.6 -> 1.1 ms in-process).
        return await self._run(lambda conn: _write(conn, change))

    async def _delete(self, change: Callable[[sqlite3.Connection], bool]) -> bool:
        """Run a deleting ``change``; if it deleted, leave its text in no file before returning
        (see the class docstring)."""

        def work(conn: sqlite3.Connection) -> bool:
            deleted = _write(conn, change)
            if deleted:
                _checkpoint_truncate(conn)
            return deleted

        return await self._run(work)

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
        if item.kind is not ItemKind.USER:
            raise ValueError("only a user item can be admitted as a user message")
        encoded = _history.encode_items([item])

        # An item id that is already stored (a retried admission) is replaced in place, as
        # in ``upsert_items``, so a retry never duplicates the message.
        def change(conn: sqlite3.Connection) -> tuple[TaskRecord, int | None]:
            task = _tasks.end_provisional(conn, task_id, now_ms)
            if item.images:
                _blobs.put_images_locked(conn, task_id, item.images, blobs or {})
            lowest = _history.upsert_items_locked(conn, task_id, encoded)
            if idempotency_key is not None:
                remember_key_locked(conn, task_id, idempotency_key, item.item_id)
            return task, lowest

        # Durability: the store runs WAL with synchronous=NORMAL, so once COMMIT returns the
        # transaction is in the WAL file; a killed process cannot lose it (see ``_connect``).
        return await self._write_items(task_id, change)

    async def keyed_message(self, task_id: str, key: str) -> str | None:
        return await self._run(lambda conn: message_for_key(conn, task_id, key))

    async def upsert_items(
        self, task_id: str, items: Sequence[TimelineItem], *, now_ms: int
    ) -> None:
        encoded = _history.encode_items(items)
        if not encoded:
            return

        def change(conn: sqlite3.Connection) -> tuple[None, int | None]:
            _tasks.touch_task(conn, task_id, now_ms)
            return None, _history.upsert_items_locked(conn, task_id, encoded)

        await self._write_items(task_id, change)

    async def _write_items(
        self, task_id: str, change: Callable[[sqlite3.Connection], tuple[_T, int | None]]
    ) -> _T:
        """Run a write of ``task_id``'s items, then bring its cached history up to date."""

        def work(conn: sqlite3.Connection) -> _T:
            try:
                result, lowest = _write(conn, change)
                self._histories.written(conn, task_id, lowest)
            except BaseException:
                self._histories.forget(task_id)
                raise
            return result

        return await self._run(work)

    async def history(self, task_id: str) -> list[TimelineItem]:
        return await self._run(lambda conn: self._histories.history(conn, task_id))

    async def replay_rows(self, task_id: str) -> list[TimelineItem | MessageRow]:
        def work(conn: sqlite3.Connection) -> list[TimelineItem | MessageRow]:
            cached = self._histories.cached(conn, task_id)
            if cached is not None:
                # A fresh copy nobody else holds: widening its item type is safe.
                return cast(list[TimelineItem | MessageRow], cached)
            # Not cached: the cache keeps whole items, and building 10,000 of them costs more
            # than the replay itself; the task's next full read fills the cache.
            return _history.read_replay(conn, task_id)

        return await self._run(work)

    async def fork_task(self, source_id: str, task: TaskRecord, *, up_to: str | None) -> int:
        def change(conn: sqlite3.Connection) -> int:
            if _tasks.read_task(conn, source_id) is None:
                raise ForkSourceMissing(message=False)
            _tasks.insert_task(conn, task)
            copied = _history.copy_items_locked(conn, source_id, task.id, up_to)
            if copied is None:
                # Raised inside the transaction: the new task's row is rolled back with it.
                raise ForkSourceMissing(message=True)
            _children.copy_children_locked(conn, source_id, task.id)
            _blobs.refer_copied_locked(conn, task.id)
            return copied

        return await self._transaction(change)

    async def children(self, task_id: str) -> list[TaskRecord]:
        return await self._run(lambda conn: _children.read_children(conn, task_id))

    async def read_blob(self, sha256: str) -> bytes | None:
        return await self._run(lambda conn: _blobs.read_blob(conn, sha256))

    async def item_count(self, task_id: str) -> int:
        return await self._run(lambda conn: _history.count_items(conn, task_id))

    async def put_transcript(self, task_id: str, run_id: str, body: bytes) -> None:
        await self._transaction(lambda conn: _history.put_transcript(conn, task_id, run_id, body))

    async def transcripts(self, task_id: str) -> dict[str, bytes]:
        return await self._run(lambda conn: _history.read_transcripts(conn, task_id))

    # -- usage -------------------------------------------------------------------------------

    async def record_usage(self, task_id: str, run_id: str, usage: Usage) -> None:
        await self._transaction(lambda conn: _tasks.put_usage(conn, task_id, run_id, usage))

    async def run_usage(self, task_id: str, run_id: str) -> Usage | None:
        return await self._run(lambda conn: _tasks.read_usage(conn, task_id, run_id))

    # -- project trust -----------------------------------------------------------------------

    async def get_trust(self, account: str, root: str) -> bool | None:
        return await self._run(lambda conn: _tasks.read_trust(conn, account, root))

    async def set_trust(
        self, account: str, root: str, trusted: bool | None, *, now_ms: int
    ) -> None:
        await self._transaction(lambda conn: _tasks.put_trust(conn, account, root, trusted, now_ms))

    # -- goals -------------------------------------------------------------------------------

    async def get_goal(self, task_id: str) -> GoalRecord | None:
        return await self._run(lambda conn: _tasks.read_goal(conn, task_id))

    async def put_goal(self, task_id: str, goal: GoalRecord | None) -> None:
        await self._transaction(lambda conn: _tasks.put_goal(conn, task_id, goal))

    # -- sweeps ------------------------------------------------------------------------------

    async def sweep_provisional(self, *, now_ms: int, stranded: bool) -> list[str]:
        def change(conn: sqlite3.Connection) -> list[str]:
            self._histories.forget()
            swept = _tasks.sweep_provisional(conn, now_ms, stranded)
            if swept:
                _blobs.drop_unreferenced_locked(conn)
            return swept

        deleted = await self._transaction(change)
        if deleted:
            logger.info("swept %d untouched provisional task(s)", len(deleted))
        return deleted


def _create_private(path: str) -> None:
    """Create a missing store file readable by its owner only: it holds whole conversations.
    SQLite gives the -wal and -shm files the main file's mode. An existing file keeps the
    mode its owner chose."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise StoreError(f"cannot create the task store ({type(exc).__name__})") from exc
    os.close(fd)


def _checkpoint_truncate(conn: sqlite3.Connection) -> None:
    """Copy the WAL into the file and cut the WAL to zero bytes, so that the frames holding a
    deleted task's text (and the zeroed pages that replace them) leave the WAL. SQLite's busy
    handler waits up to ``BUSY_TIMEOUT_MS`` for readers of an older snapshot; past that the
    row says ``busy`` and the WAL is left as it is (logged, never raised: the delete stands)."""
    try:
        busy, log_frames, _copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.Error as exc:
        logger.warning(
            "the task store's WAL could not be checkpointed after a delete (%s); the next "
            "delete or the store's close will retry",
            type(exc).__name__,
        )
        return
    if busy:
        logger.warning(
            "a reader kept the task store's WAL from being truncated after a delete (%d "
            "frame(s) left); the next delete or the store's close will retry",
            log_frames,
        )


def _open(path: str) -> tuple[sqlite3.Connection, DataDirectoryLock]:
    """Lock the data directory, then connect (on a worker thread). The lock comes first, so
    nothing touches the file (not even the migration) without it."""
    lock = DataDirectoryLock.acquire(path)
    try:
        return _connect(path), lock
    except BaseException:
        lock.release()
        raise


def _connect(path: str) -> sqlite3.Connection:
    """Open the file, set the connection up and migrate it (on a worker thread)."""
    _create_private(path)
    try:
        # isolation_level=None: the module never opens transactions behind our back; every
        # write is an explicit BEGIN IMMEDIATE ... COMMIT.
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the task store ({type(exc).__name__})") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"the task store cannot use WAL journaling (got {mode!r})")
        # In WAL mode, NORMAL syncs the WAL only at checkpoints, not at every commit. A commit
        # has still been written to the WAL file (the OS page cache) before COMMIT returns, so
        # it survives the process being killed (kill -9, a crash); only a power loss or an OS
        # crash can take back the last commits. That is the durability an admitted message
        # needs, at a fraction of FULL's cost per write.
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        # A delete overwrites what it frees with zeros, instead of leaving the text in free
        # pages; set here, not left to how SQLite was built.
        conn.execute("PRAGMA secure_delete = ON")
        if conn.execute("PRAGMA secure_delete").fetchone()[0] != 1:
            raise StoreError("this SQLite build cannot overwrite deleted content")
        # Deleting a task relies on cascades; a build without foreign keys would leave orphans.
        if conn.execute("PRAGMA foreign_keys").fetchone()[0] != 1:
            raise StoreError("this SQLite build cannot enforce foreign keys")
        found = migrate(conn)
        if found == 0:
            # A fresh store: nothing was migrated, so the log says what happened.
            logger.info("task store created at %s (schema %d)", path, SCHEMA_VERSION)
        elif found != SCHEMA_VERSION:
            logger.info("task store schema migrated from %d to %d", found, SCHEMA_VERSION)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error):
            raise StoreError(f"cannot open the task store ({type(exc).__name__})") from exc
        raise
    return conn


if TYPE_CHECKING:
    # mypy proves here that the class satisfies the protocol the runtime is written against.
    def _satisfies_protocol(store: SqliteTaskStore) -> TaskStore:
        return store
