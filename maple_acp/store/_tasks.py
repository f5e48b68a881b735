"""The task half of the SQLite store: task rows and what hangs off a task besides its
history (goal, per-run usage), project trust, list pages with their cursors, and sweeps.

Functions here run on the store's worker thread with its one connection; a write function
expects the caller to hold an open write transaction (see ``_sqlite._write``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from maple_acp.model import (
    GoalRecord,
    GoalStatus,
    TaskPage,
    TaskPolicy,
    TaskQuery,
    TaskRecord,
    TaskSurface,
    Usage,
)
from maple_acp.store._protocol import InvalidCursor, StoreError

#: The most rows one list page returns, whatever the caller asks for (docs/protocol.md).
MAX_PAGE = 100
#: Longest cursor accepted; a real one is a small fraction of this, so anything longer is not
#: ours and is refused before it is decoded.
MAX_CURSOR_CHARS = 4_096

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
    "mode",
    "thought_level",
    "additional_directories",
    "boolean_options",
    "parent_id",
    "parent_tool_id",
)
TASK_SELECT = ", ".join(_TASK_COLUMNS)

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
        task.mode,
        task.thought_level,
        encode_directories(task.additional_directories),
        encode_boolean_options(task.boolean_options),
        task.parent_id,
        task.parent_tool_id,
    )


def encode_directories(directories: Sequence[str]) -> str:
    """A task's additional directories as their column holds them (a JSON array)."""
    return orjson.dumps(list(directories)).decode()


def encode_boolean_options(options: Sequence[tuple[str, bool]]) -> str:
    """A task's boolean options as their column holds them (a JSON object)."""
    return orjson.dumps(dict(options)).decode()


def _boolean_options(text: str) -> tuple[tuple[str, bool], ...]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise StoreError("a stored task's boolean options are malformed") from exc
    if not isinstance(value, dict) or not all(isinstance(v, bool) for v in value.values()):
        raise StoreError("a stored task's boolean options are malformed")
    return tuple(sorted(value.items()))


def _directories(text: str) -> tuple[str, ...]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise StoreError("a stored task's directory list is malformed") from exc
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise StoreError("a stored task's directory list is malformed")
    return tuple(value)


def task_from_row(row: Sequence[Any]) -> TaskRecord:
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
            mode=row[13],
            thought_level=row[14],
            additional_directories=_directories(row[15]),
            boolean_options=_boolean_options(row[16]),
            parent_id=row[17],
            parent_tool_id=row[18],
        )
    except ValueError as exc:
        raise StoreError("a stored task row holds a value this version does not know") from exc


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
    # A child session is shown through its parent, never as a session of its own.
    where.append("parent_id IS NULL")
    if query.cursor is not None:
        updated_ms, last_id = _decode_cursor(query, query.cursor)
        # A row-value comparison, not the equivalent OR: SQLite turns it into a range on the
        # index, so a deep page starts at the cursor instead of skipping every earlier row.
        where.append("(updated_ms, id) < (?, ?)")
        params.extend((updated_ms, last_id))
    sql = (
        f"SELECT {TASK_SELECT} FROM tasks WHERE {' AND '.join(where)} "
        "ORDER BY updated_ms DESC, id DESC LIMIT ?"
    )
    params.append(limit + 1)
    return sql, params, limit


# -- tasks -----------------------------------------------------------------------------------


def insert_task(conn: sqlite3.Connection, task: TaskRecord) -> None:
    try:
        conn.execute(
            f"INSERT INTO tasks ({TASK_SELECT}) VALUES ({', '.join('?' * len(_TASK_COLUMNS))})",
            _task_params(task),
        )
    except sqlite3.IntegrityError as exc:
        raise StoreError("a task with this id already exists") from exc


def read_task(conn: sqlite3.Connection, task_id: str) -> TaskRecord | None:
    row = conn.execute(f"SELECT {TASK_SELECT} FROM tasks WHERE id = ?", (task_id,)).fetchone()
    return None if row is None else task_from_row(row)


def read_page(conn: sqlite3.Connection, query: TaskQuery) -> TaskPage:
    sql, params, limit = list_sql(query)
    rows = conn.execute(sql, params).fetchall()
    tasks = tuple(task_from_row(row) for row in rows[:limit])
    next_cursor = _encode_cursor(query, tasks[-1]) if len(rows) > limit else None
    return TaskPage(tasks=tasks, next_cursor=next_cursor)


def update_task(
    conn: sqlite3.Connection, task_id: str, assignments: str, params: Sequence[Any]
) -> TaskRecord | None:
    """Apply ``assignments`` (a SET clause) to one task; the new row, ``None`` if none."""
    rows = conn.execute(
        f"UPDATE tasks SET {assignments} WHERE id = ? RETURNING {TASK_SELECT}",
        (*params, task_id),
    ).fetchall()
    return task_from_row(rows[0]) if rows else None


def end_provisional(conn: sqlite3.Connection, task_id: str, now_ms: int) -> TaskRecord:
    """A task's first admitted message: it stops being provisional. ``StoreError`` if gone."""
    task = update_task(
        conn,
        task_id,
        "provisional = 0, provisional_expires_ms = NULL, updated_ms = ?",
        (now_ms,),
    )
    if task is None:
        raise StoreError("no such task")
    return task


def touch_task(conn: sqlite3.Connection, task_id: str, now_ms: int) -> None:
    """Bump ``updated_ms``; ``StoreError`` if there is no such task."""
    touched = conn.execute(
        "UPDATE tasks SET updated_ms = ? WHERE id = ?", (now_ms, task_id)
    ).rowcount
    if touched == 0:
        raise StoreError("no such task")


def delete_task(conn: sqlite3.Connection, task_id: str) -> bool:
    return conn.execute("DELETE FROM tasks WHERE id = ?", (task_id,)).rowcount > 0


#: One statement: the comparison of every column, the provisional flag and the absence of
#: items are evaluated by the same write that deletes, so nothing can slip between. IS (not =)
#: so that NULL columns compare equal to a NULL in the snapshot.
#: No row of the task's own: rows a fork copied (``forks.copied_seq``) do not count.
_UNTOUCHED = (
    "NOT EXISTS (SELECT 1 FROM items WHERE items.task_id = tasks.id AND items.seq > "
    "IFNULL((SELECT copied_seq FROM forks WHERE forks.task_id = tasks.id), 0))"
)
_DELETE_IF_UNCHANGED = (
    "DELETE FROM tasks WHERE id = ? AND "
    + " AND ".join(f"{name} IS ?" for name in _TASK_COLUMNS[1:])
    + f" AND provisional = 1 AND {_UNTOUCHED}"
)


def delete_task_if_unchanged(conn: sqlite3.Connection, snapshot: TaskRecord) -> bool:
    if not snapshot.provisional:
        return False
    return conn.execute(_DELETE_IF_UNCHANGED, _task_params(snapshot)).rowcount > 0


_SWEEP = (
    "DELETE FROM tasks WHERE provisional = 1 AND surface = ? AND user_renamed = 0 "
    f"AND {_UNTOUCHED} "
    "AND (provisional_expires_ms <= ? "
    "OR (? AND provisional_expires_ms IS NULL)) RETURNING id"
)


def sweep_provisional(conn: sqlite3.Connection, now_ms: int, stranded: bool) -> list[str]:
    params = (TaskSurface.EXTERNAL.value, now_ms, int(stranded))
    return sorted(row[0] for row in conn.execute(_SWEEP, params).fetchall())


# -- usage -----------------------------------------------------------------------------------

_USAGE_UPSERT = (
    f"INSERT INTO usage (task_id, run_id, {_USAGE_SELECT}) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (task_id, run_id) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in _USAGE_COLUMNS)
)


def put_usage(conn: sqlite3.Connection, task_id: str, run_id: str, usage: Usage) -> None:
    values = (
        usage.input_tokens,
        usage.output_tokens,
        usage.total_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
    )
    try:
        conn.execute(_USAGE_UPSERT, (task_id, run_id, *values))
    except sqlite3.IntegrityError as exc:
        raise StoreError("no such task") from exc


def read_usage(conn: sqlite3.Connection, task_id: str, run_id: str) -> Usage | None:
    row = conn.execute(
        f"SELECT {_USAGE_SELECT} FROM usage WHERE task_id = ? AND run_id = ?",
        (task_id, run_id),
    ).fetchone()
    if row is None:
        return None
    return Usage(**dict(zip(_USAGE_COLUMNS, row, strict=True)))


# -- project trust ---------------------------------------------------------------------------


def read_trust(conn: sqlite3.Connection, account: str, root: str) -> bool | None:
    row = conn.execute(
        "SELECT trusted FROM trust WHERE account = ? AND root = ?", (account, root)
    ).fetchone()
    return None if row is None else bool(row[0])


def put_trust(
    conn: sqlite3.Connection, account: str, root: str, trusted: bool | None, now_ms: int
) -> None:
    if trusted is None:
        conn.execute("DELETE FROM trust WHERE account = ? AND root = ?", (account, root))
        return
    conn.execute(
        "INSERT INTO trust (account, root, trusted, updated_ms) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (account, root) DO UPDATE SET "
        "trusted = excluded.trusted, updated_ms = excluded.updated_ms",
        (account, root, int(trusted), now_ms),
    )


# -- goals -----------------------------------------------------------------------------------

_GOAL_UPSERT = (
    f"INSERT INTO goals (task_id, {_GOAL_SELECT}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (task_id) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in _GOAL_COLUMNS)
)


def read_goal(conn: sqlite3.Connection, task_id: str) -> GoalRecord | None:
    row = conn.execute(f"SELECT {_GOAL_SELECT} FROM goals WHERE task_id = ?", (task_id,)).fetchone()
    return None if row is None else _goal_from_row(row)


def put_goal(conn: sqlite3.Connection, task_id: str, goal: GoalRecord | None) -> None:
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
    try:
        conn.execute(_GOAL_UPSERT, (task_id, *values))
    except sqlite3.IntegrityError as exc:
        raise StoreError("no such task") from exc
