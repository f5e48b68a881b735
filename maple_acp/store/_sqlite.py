"""The SQLite implementation of ``TaskStore``: one file per host data directory."""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import sqlite3
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import orjson
import trio

from maple_acp.model import (
    FileDiff,
    GoalRecord,
    GoalStatus,
    ItemKind,
    PlanEntry,
    PlanPriority,
    PlanStatus,
    TaskPage,
    TaskPolicy,
    TaskQuery,
    TaskRecord,
    TaskSurface,
    TimelineItem,
    ToolLocation,
    ToolState,
    ToolStatus,
    Usage,
)
from maple_acp.store._migrations import SCHEMA_VERSION, migrate
from maple_acp.store._protocol import InvalidCursor, StoreError, TaskStore

logger = logging.getLogger(__name__)

#: The most rows one list page returns, whatever the caller asks for (SPEC: pages of 100).
MAX_PAGE = 100
#: How long a writer waits for another process's lock on the file before failing.
BUSY_TIMEOUT_MS = 5_000
#: Longest cursor accepted; a real one is a small fraction of this, so anything longer is not
#: ours and is refused before it is decoded.
MAX_CURSOR_CHARS = 4_096

_T = TypeVar("_T")

_TASK_COLUMNS = (
    "id",
    "account",
    "root",
    "title",
    "user_renamed",
    "created_ms",
    "updated_ms",
    "policy",
    "surface",
    "model",
    "archived",
    "provisional",
    "provisional_expires_ms",
)
_TASK_SELECT = ", ".join(_TASK_COLUMNS)

_ITEM_COLUMNS = (
    "seq",
    "item_id",
    "kind",
    "run_id",
    "created_ms",
    "text",
    "tool_name",
    "tool_status",
    "tool_title",
    "raw_input",
    "raw_output",
    "output_text",
    "locations",
    "diffs",
    "plan",
)
_ITEM_SELECT = ", ".join(_ITEM_COLUMNS)

_GOAL_COLUMNS = (
    "objective",
    "status",
    "iterations",
    "last_reason",
    "created_ms",
    "updated_ms",
    "token_budget",
    "tokens_used",
)
_GOAL_SELECT = ", ".join(_GOAL_COLUMNS)

_USAGE_COLUMNS = (
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)
_USAGE_SELECT = ", ".join(_USAGE_COLUMNS)


# -- row <-> record --------------------------------------------------------------------------


def _task_params(task: TaskRecord) -> tuple[Any, ...]:
    return (
        task.id,
        task.account,
        task.root,
        task.title,
        int(task.user_renamed),
        task.created_ms,
        task.updated_ms,
        task.policy.value,
        task.surface.value,
        task.model,
        int(task.archived),
        int(task.provisional),
        task.provisional_expires_ms,
    )


def _task_from_row(row: Sequence[Any]) -> TaskRecord:
    try:
        return TaskRecord(
            id=row[0],
            account=row[1],
            root=row[2],
            title=row[3],
            user_renamed=bool(row[4]),
            created_ms=row[5],
            updated_ms=row[6],
            policy=TaskPolicy(row[7]),
            surface=TaskSurface(row[8]),
            model=row[9],
            archived=bool(row[10]),
            provisional=bool(row[11]),
            provisional_expires_ms=row[12],
        )
    except ValueError as exc:
        raise StoreError("a stored task row holds a value this version does not know") from exc


def _encode_json(value: Any) -> str | None:
    """JSON text of a raw tool value; ``None`` is stored as SQL NULL."""
    if value is None:
        return None
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        raise StoreError("a tool's raw value is not JSON-serialisable") from exc


def _decode_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise StoreError("a stored JSON value is malformed") from exc


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _encode_locations(locations: Sequence[ToolLocation]) -> str:
    return _dumps([{"path": loc.path, "line": loc.line} for loc in locations])


def _encode_diffs(diffs: Sequence[FileDiff]) -> str | None:
    if not diffs:
        return None
    return _dumps(
        [
            {"path": d.path, "new": d.new_text, "old": d.old_text, "truncated": d.truncated}
            for d in diffs
        ]
    )


def _encode_plan(plan: Sequence[PlanEntry]) -> str | None:
    if not plan:
        return None
    return _dumps(
        [
            {"content": e.content, "priority": e.priority.value, "status": e.status.value}
            for e in plan
        ]
    )


def _item_params(item: TimelineItem) -> tuple[Any, ...]:
    """Encode everything up front, so a value that cannot be stored fails before any write."""
    tool = item.tool
    if tool is None:
        tool_params: tuple[Any, ...] = (None,) * 8
    else:
        tool_params = (
            tool.name,
            tool.status.value,
            tool.title,
            _encode_json(tool.raw_input),
            _encode_json(tool.raw_output),
            tool.output_text,
            _encode_locations(tool.locations),
            _encode_diffs(tool.diffs),
        )
    return (
        item.item_id,
        item.kind.value,
        item.run_id,
        item.created_ms,
        item.text,
        *tool_params,
        _encode_plan(item.plan),
    )


def _json_objects(text: str | None, what: str) -> list[dict[str, Any]]:
    """A stored JSON list of objects (``[]`` for NULL); ``StoreError`` for anything else."""
    value = _decode_json(text)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise StoreError(f"a stored {what} list is malformed")
    return value


def _decode_locations(text: str | None) -> tuple[ToolLocation, ...]:
    locations = []
    for obj in _json_objects(text, "tool location"):
        path, line = obj.get("path"), obj.get("line")
        if not isinstance(path, str) or not (line is None or type(line) is int):
            raise StoreError("a stored tool location is malformed")
        locations.append(ToolLocation(path=path, line=line))
    return tuple(locations)


def _decode_diffs(text: str | None) -> tuple[FileDiff, ...]:
    diffs = []
    for obj in _json_objects(text, "file diff"):
        path, new, old, truncated = (
            obj.get("path"),
            obj.get("new"),
            obj.get("old"),
            obj.get("truncated"),
        )
        if (
            not isinstance(path, str)
            or not isinstance(new, str)
            or not (old is None or isinstance(old, str))
            or not isinstance(truncated, bool)
        ):
            raise StoreError("a stored file diff is malformed")
        diffs.append(FileDiff(path=path, new_text=new, old_text=old, truncated=truncated))
    return tuple(diffs)


def _decode_plan(text: str | None) -> tuple[PlanEntry, ...]:
    entries = []
    for obj in _json_objects(text, "plan"):
        content, priority, status = obj.get("content"), obj.get("priority"), obj.get("status")
        if not (isinstance(content, str) and isinstance(priority, str) and isinstance(status, str)):
            raise StoreError("a stored plan entry is malformed")
        # An unknown priority or status is a ValueError, reported by the caller.
        entries.append(
            PlanEntry(content=content, priority=PlanPriority(priority), status=PlanStatus(status))
        )
    return tuple(entries)


def _item_from_row(row: Sequence[Any]) -> TimelineItem:
    try:
        tool = None
        if row[6] is not None:
            tool = ToolState(
                name=row[6],
                status=ToolStatus(row[7]),
                title=row[8] or "",
                raw_input=_decode_json(row[9]),
                raw_output=_decode_json(row[10]),
                output_text=row[11],
                locations=_decode_locations(row[12]),
                diffs=_decode_diffs(row[13]),
            )
        return TimelineItem(
            seq=row[0],
            item_id=row[1],
            kind=ItemKind(row[2]),
            run_id=row[3],
            created_ms=row[4],
            text=row[5],
            tool=tool,
            plan=_decode_plan(row[14]),
        )
    except ValueError as exc:
        raise StoreError("a stored item row holds a value this version does not know") from exc


def _goal_from_row(row: Sequence[Any]) -> GoalRecord:
    try:
        status = GoalStatus(row[1])
    except ValueError as exc:
        raise StoreError("a stored goal holds a status this version does not know") from exc
    return GoalRecord(
        objective=row[0],
        status=status,
        iterations=row[2],
        last_reason=row[3],
        created_ms=row[4],
        updated_ms=row[5],
        token_budget=row[6],
        tokens_used=row[7],
    )


# -- list cursors ----------------------------------------------------------------------------


def _query_key(query: TaskQuery) -> str:
    """A digest of the filters (not the page size), so a cursor only continues the query that
    issued it."""
    filters = orjson.dumps(
        [
            query.account,
            query.root,
            None if query.policy is None else query.policy.value,
            query.include_provisional,
            query.include_archived,
        ]
    )
    return hashlib.sha256(filters).hexdigest()[:32]


def _encode_cursor(query: TaskQuery, last: TaskRecord) -> str:
    payload = orjson.dumps({"u": last.updated_ms, "i": last.id, "q": _query_key(query)})
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


def _decode_cursor(query: TaskQuery, cursor: str) -> tuple[int, str]:
    """The (updated_ms, id) position a cursor continues from; ``InvalidCursor`` for anything
    this store did not issue for this very query."""
    bad = InvalidCursor("the list cursor is not valid for this query")
    if not isinstance(cursor, str) or not cursor or len(cursor) > MAX_CURSOR_CHARS:
        raise bad
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
        payload = orjson.loads(raw)
    except (binascii.Error, ValueError) as exc:
        raise bad from exc
    if not isinstance(payload, dict) or set(payload) != {"u", "i", "q"}:
        raise bad
    updated_ms, task_id, key = payload["u"], payload["i"], payload["q"]
    if (
        type(updated_ms) is not int
        or not isinstance(task_id, str)
        or not isinstance(key, str)
        or key != _query_key(query)
    ):
        raise bad
    return updated_ms, task_id


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


#: Positions within ``_item_params``' tuple, which follows ``_ITEM_COLUMNS`` without ``seq``.
_PARAM_ITEM_ID = _ITEM_COLUMNS.index("item_id") - 1
_PARAM_TOOL_NAME = _ITEM_COLUMNS.index("tool_name") - 1
_PARAM_RAW_INPUT = _ITEM_COLUMNS.index("raw_input") - 1
_PARAM_LOCATIONS = _ITEM_COLUMNS.index("locations") - 1
_PARAM_DIFFS = _ITEM_COLUMNS.index("diffs") - 1
#: What an empty value of each kept field looks like once encoded.
_EMPTY_LOCATIONS = _encode_locations(())
_INSERT_ITEM = (
    f"INSERT INTO items (task_id, seq, {', '.join(_ITEM_COLUMNS[1:])}) "
    f"VALUES (?, ?, {', '.join('?' * (len(_ITEM_COLUMNS) - 1))})"
)
_REPLACE_ITEM = (
    f"UPDATE items SET {', '.join(f'{name} = ?' for name in _ITEM_COLUMNS[1:])} "
    "WHERE task_id = ? AND seq = ?"
)


def _upsert_items_locked(
    conn: sqlite3.Connection, task_id: str, encoded: Sequence[tuple[Any, ...]]
) -> None:
    """Insert or replace items inside an open write transaction."""
    row = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM items WHERE task_id = ?", (task_id,))
    next_seq = int(row.fetchone()[0]) + 1
    for params in encoded:
        stored = conn.execute(
            "SELECT seq, tool_name, raw_input, locations, diffs FROM items "
            "WHERE task_id = ? AND item_id = ?",
            (task_id, params[_PARAM_ITEM_ID]),
        ).fetchone()
        if stored is None:
            conn.execute(_INSERT_ITEM, (task_id, next_seq, *params))
            next_seq += 1
            continue
        seq, stored_tool_name, stored_raw_input, stored_locations, stored_diffs = stored
        values = list(params)
        # A later update of a tool call often carries only the result; the request that was
        # recorded first (its input, the files it named, the edit it proposed) must survive
        # it: history replays the request next to the result.
        if values[_PARAM_TOOL_NAME] is not None and stored_tool_name is not None:
            if values[_PARAM_RAW_INPUT] is None:
                values[_PARAM_RAW_INPUT] = stored_raw_input
            if values[_PARAM_LOCATIONS] == _EMPTY_LOCATIONS:
                values[_PARAM_LOCATIONS] = stored_locations
            if values[_PARAM_DIFFS] is None:
                values[_PARAM_DIFFS] = stored_diffs
        conn.execute(_REPLACE_ITEM, (*values, task_id, seq))


def list_sql(query: TaskQuery) -> tuple[str, list[Any], int]:
    """The statement of one list page, its parameters and the page size.

    It asks for one row more than the page size: that row's presence is what says another
    page exists. (Module-level so the benchmark can show the query plan of the real query.)
    """
    if query.limit < 1:
        raise ValueError("a list page holds at least one task")
    limit = min(query.limit, MAX_PAGE)
    where = ["account = ?"]
    params: list[Any] = [query.account]
    if query.root is not None:
        where.append("root = ?")
        params.append(query.root)
    if query.policy is not None:
        where.append("policy = ?")
        params.append(query.policy.value)
    # Literal conditions (not parameters), so the planner can match the partial indexes.
    if not query.include_provisional:
        where.append("provisional = 0")
    if not query.include_archived:
        where.append("archived = 0")
    if query.cursor is not None:
        updated_ms, last_id = _decode_cursor(query, query.cursor)
        # A row-value comparison, not the equivalent OR: SQLite turns it into a range on the
        # index, so a deep page starts at the cursor instead of skipping every earlier row.
        where.append("(updated_ms, id) < (?, ?)")
        params.extend((updated_ms, last_id))
    sql = (
        f"SELECT {_TASK_SELECT} FROM tasks WHERE {' AND '.join(where)} "
        "ORDER BY updated_ms DESC, id DESC LIMIT ?"
    )
    params.append(limit + 1)
    return sql, params, limit


class SqliteTaskStore:
    """``TaskStore`` over one SQLite file in WAL mode.

    Every call runs on a worker thread through ``trio.to_thread.run_sync``; one connection is
    shared by all calls and a ``CapacityLimiter(1)`` lets exactly one thread use it at a time,
    in the order the calls arrived.

    Resource handling: ``open`` creates (or migrates) the file and holds one connection until
    ``aclose``, which waits for the running call, then closes it. The store is an async
    context manager that closes itself on exit.

    Error handling: SQLite failures surface as ``StoreError`` (without row content); a cursor
    that is not this query's is ``InvalidCursor``; programming errors (a page size below 1, a
    non-user item passed to ``admit_user_message``) are ``ValueError``.

    Cancellation: store calls are uncancellable while they run. A call is not abandoned once
    its thread started (``abandon_on_cancel=False``), so a cancelled caller never leaves a
    half-done transaction behind: the call completes, returns (or raises) as usual, and the
    caller meets its cancellation at its next checkpoint. A call still waiting for the
    connection is cancelled at once, without touching the file.
    """

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._path = path
        self._limiter = trio.CapacityLimiter(1)

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    async def open(cls, path: str | os.PathLike[str]) -> SqliteTaskStore:
        """Open (creating or migrating) the store at ``path``. Raises ``StoreError`` if the
        file is not a task store this version can read."""
        fspath = os.fspath(path)
        conn = await trio.to_thread.run_sync(_connect, fspath, abandon_on_cancel=False)
        return cls(conn, fspath)

    async def aclose(self) -> None:
        """Close the connection after the running call (if any). Idempotent."""

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
                conn.close()

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

    # -- tasks -------------------------------------------------------------------------------

    async def create_task(self, task: TaskRecord) -> None:
        params = _task_params(task)

        def change(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(
                    f"INSERT INTO tasks ({_TASK_SELECT}) "
                    f"VALUES ({', '.join('?' * len(_TASK_COLUMNS))})",
                    params,
                )
            except sqlite3.IntegrityError as exc:
                raise StoreError("a task with this id already exists") from exc

        await self._run(lambda conn: _write(conn, change))

    async def get_task(self, task_id: str) -> TaskRecord | None:
        def read(conn: sqlite3.Connection) -> TaskRecord | None:
            row = conn.execute(
                f"SELECT {_TASK_SELECT} FROM tasks WHERE id = ?", (task_id,)
            ).fetchone()
            return None if row is None else _task_from_row(row)

        return await self._run(read)

    async def list_tasks(self, query: TaskQuery) -> TaskPage:
        sql, params, limit = list_sql(query)

        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(sql, params).fetchall()

        rows = await self._run(read)
        tasks = tuple(_task_from_row(row) for row in rows[:limit])
        next_cursor = _encode_cursor(query, tasks[-1]) if len(rows) > limit else None
        return TaskPage(tasks=tasks, next_cursor=next_cursor)

    async def _update_task(self, task_id: str, assignments: str, params: Sequence[Any]) -> Any:
        def change(conn: sqlite3.Connection) -> TaskRecord | None:
            rows = conn.execute(
                f"UPDATE tasks SET {assignments} WHERE id = ? RETURNING {_TASK_SELECT}",
                (*params, task_id),
            ).fetchall()
            return _task_from_row(rows[0]) if rows else None

        return await self._run(lambda conn: _write(conn, change))

    async def rename_task(
        self, task_id: str, title: str, *, user_renamed: bool, now_ms: int
    ) -> TaskRecord | None:
        # The flag is stored as given: the runtime decides whether an automatic title may
        # follow a person's rename.
        result: TaskRecord | None = await self._update_task(
            task_id,
            "title = ?, user_renamed = ?, updated_ms = ?",
            (title, int(user_renamed), now_ms),
        )
        return result

    async def set_task_model(
        self, task_id: str, model: str | None, *, now_ms: int
    ) -> TaskRecord | None:
        result: TaskRecord | None = await self._update_task(
            task_id, "model = ?, updated_ms = ?", (model, now_ms)
        )
        return result

    async def set_provisional_expiry(
        self, task_id: str, expires_ms: int | None
    ) -> TaskRecord | None:
        # A durable task has no grace to start: the CASE leaves its row exactly as it was.
        result: TaskRecord | None = await self._update_task(
            task_id,
            "provisional_expires_ms = CASE WHEN provisional = 1 THEN ? "
            "ELSE provisional_expires_ms END",
            (expires_ms,),
        )
        return result

    async def set_archived(self, task_id: str, archived: bool, *, now_ms: int) -> TaskRecord | None:
        result: TaskRecord | None = await self._update_task(
            task_id, "archived = ?, updated_ms = ?", (int(archived), now_ms)
        )
        return result

    async def delete_task(self, task_id: str) -> bool:
        def change(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM tasks WHERE id = ?", (task_id,)).rowcount > 0

        return await self._run(lambda conn: _write(conn, change))

    async def delete_task_if_unchanged(self, snapshot: TaskRecord) -> bool:
        if not snapshot.provisional:
            return False
        params = _task_params(snapshot)
        # One statement: the comparison of every column, the provisional flag and the absence
        # of items are evaluated by the same write that deletes, so nothing can slip between.
        # IS (not =) so that NULL columns compare equal to a NULL in the snapshot.
        same = " AND ".join(f"{name} IS ?" for name in _TASK_COLUMNS[1:])
        sql = (
            f"DELETE FROM tasks WHERE id = ? AND {same} AND provisional = 1 "
            "AND NOT EXISTS (SELECT 1 FROM items WHERE items.task_id = tasks.id)"
        )

        def change(conn: sqlite3.Connection) -> bool:
            return conn.execute(sql, params).rowcount > 0

        return await self._run(lambda conn: _write(conn, change))

    # -- timeline ----------------------------------------------------------------------------

    async def admit_user_message(
        self, task_id: str, item: TimelineItem, *, now_ms: int
    ) -> TaskRecord:
        if item.kind is not ItemKind.USER:
            raise ValueError("only a user item can be admitted as a user message")
        encoded = _item_params(item)

        # An item id that is already stored (a retried admission) is replaced in place, as
        # in ``upsert_items``, so a retry never duplicates the message.
        def change(conn: sqlite3.Connection) -> TaskRecord:
            rows = conn.execute(
                "UPDATE tasks SET provisional = 0, provisional_expires_ms = NULL, "
                f"updated_ms = ? WHERE id = ? RETURNING {_TASK_SELECT}",
                (now_ms, task_id),
            ).fetchall()
            if not rows:
                raise StoreError("no such task")
            _upsert_items_locked(conn, task_id, [encoded])
            return _task_from_row(rows[0])

        # Durability: the store runs WAL with synchronous=NORMAL, so once COMMIT returns the
        # transaction is in the WAL file; a killed process cannot lose it (see ``_connect``).
        return await self._run(lambda conn: _write(conn, change))

    async def upsert_items(
        self, task_id: str, items: Sequence[TimelineItem], *, now_ms: int
    ) -> None:
        encoded = [_item_params(item) for item in items]
        if not encoded:
            return

        def change(conn: sqlite3.Connection) -> None:
            touched = conn.execute(
                "UPDATE tasks SET updated_ms = ? WHERE id = ?", (now_ms, task_id)
            ).rowcount
            if touched == 0:
                raise StoreError("no such task")
            _upsert_items_locked(conn, task_id, encoded)

        await self._run(lambda conn: _write(conn, change))

    async def history(self, task_id: str) -> list[TimelineItem]:
        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(
                f"SELECT {_ITEM_SELECT} FROM items WHERE task_id = ? ORDER BY seq",
                (task_id,),
            ).fetchall()

        return [_item_from_row(row) for row in await self._run(read)]

    async def item_count(self, task_id: str) -> int:
        def read(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT COUNT(*) FROM items WHERE task_id = ?", (task_id,))
            return int(row.fetchone()[0])

        return await self._run(read)

    # -- usage -------------------------------------------------------------------------------

    async def record_usage(self, task_id: str, run_id: str, usage: Usage) -> None:
        values = (
            usage.input_tokens,
            usage.output_tokens,
            usage.total_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
        )
        updates = ", ".join(f"{name} = excluded.{name}" for name in _USAGE_COLUMNS)

        def change(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(
                    f"INSERT INTO usage (task_id, run_id, {_USAGE_SELECT}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?) "
                    f"ON CONFLICT (task_id, run_id) DO UPDATE SET {updates}",
                    (task_id, run_id, *values),
                )
            except sqlite3.IntegrityError as exc:
                raise StoreError("no such task") from exc

        await self._run(lambda conn: _write(conn, change))

    async def run_usage(self, task_id: str, run_id: str) -> Usage | None:
        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                f"SELECT {_USAGE_SELECT} FROM usage WHERE task_id = ? AND run_id = ?",
                (task_id, run_id),
            ).fetchone()

        row = await self._run(read)
        if row is None:
            return None
        return Usage(**dict(zip(_USAGE_COLUMNS, row, strict=True)))

    # -- project trust -----------------------------------------------------------------------

    async def get_trust(self, account: str, root: str) -> bool | None:
        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                "SELECT trusted FROM trust WHERE account = ? AND root = ?", (account, root)
            ).fetchone()

        row = await self._run(read)
        return None if row is None else bool(row[0])

    async def set_trust(
        self, account: str, root: str, trusted: bool | None, *, now_ms: int
    ) -> None:
        def change(conn: sqlite3.Connection) -> None:
            if trusted is None:
                conn.execute("DELETE FROM trust WHERE account = ? AND root = ?", (account, root))
                return
            conn.execute(
                "INSERT INTO trust (account, root, trusted, updated_ms) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (account, root) DO UPDATE SET "
                "trusted = excluded.trusted, updated_ms = excluded.updated_ms",
                (account, root, int(trusted), now_ms),
            )

        await self._run(lambda conn: _write(conn, change))

    # -- goals -------------------------------------------------------------------------------

    async def get_goal(self, task_id: str) -> GoalRecord | None:
        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                f"SELECT {_GOAL_SELECT} FROM goals WHERE task_id = ?", (task_id,)
            ).fetchone()

        row = await self._run(read)
        return None if row is None else _goal_from_row(row)

    async def put_goal(self, task_id: str, goal: GoalRecord | None) -> None:
        def change(conn: sqlite3.Connection) -> None:
            if goal is None:
                conn.execute("DELETE FROM goals WHERE task_id = ?", (task_id,))
                return
            values = (
                goal.objective,
                goal.status.value,
                goal.iterations,
                goal.last_reason,
                goal.created_ms,
                goal.updated_ms,
                goal.token_budget,
                goal.tokens_used,
            )
            updates = ", ".join(f"{name} = excluded.{name}" for name in _GOAL_COLUMNS)
            try:
                conn.execute(
                    f"INSERT INTO goals (task_id, {_GOAL_SELECT}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    f"ON CONFLICT (task_id) DO UPDATE SET {updates}",
                    (task_id, *values),
                )
            except sqlite3.IntegrityError as exc:
                raise StoreError("no such task") from exc

        await self._run(lambda conn: _write(conn, change))

    # -- sweeps ------------------------------------------------------------------------------

    async def sweep_provisional(self, *, now_ms: int, stranded: bool) -> list[str]:
        sql = (
            "DELETE FROM tasks WHERE provisional = 1 AND surface = ? AND user_renamed = 0 "
            "AND NOT EXISTS (SELECT 1 FROM items WHERE items.task_id = tasks.id) "
            "AND (provisional_expires_ms <= ? "
            "OR (? AND provisional_expires_ms IS NULL)) RETURNING id"
        )
        params = (TaskSurface.EXTERNAL.value, now_ms, int(stranded))

        def change(conn: sqlite3.Connection) -> list[str]:
            return sorted(row[0] for row in conn.execute(sql, params).fetchall())

        deleted = await self._run(lambda conn: _write(conn, change))
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
        # Deleting a task relies on cascades; a build without foreign keys would leave orphans.
        if conn.execute("PRAGMA foreign_keys").fetchone()[0] != 1:
            raise StoreError("this SQLite build cannot enforce foreign keys")
        found = migrate(conn)
        if found != SCHEMA_VERSION:
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
