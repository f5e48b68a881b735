"""Child sessions in the SQLite store: a parent's children in delegation order, and their
copies when the parent is forked. Their rows are deleted with the parent (``ON DELETE
CASCADE`` on ``tasks.parent_id``)."""

from __future__ import annotations

import sqlite3
import uuid

import attrs

from maple_acp.model import TaskRecord
from maple_acp.store import _history, _tasks

_CHILDREN = f"SELECT {_tasks.TASK_SELECT} FROM tasks WHERE parent_id = ? ORDER BY created_ms, rowid"
_HAS_ITEM = "SELECT 1 FROM items WHERE task_id = ? AND item_id = ?"


def read_children(conn: sqlite3.Connection, parent_id: str) -> list[TaskRecord]:
    """The children of ``parent_id``, in the order they were delegated."""
    return [_tasks.task_from_row(row) for row in conn.execute(_CHILDREN, (parent_id,))]


def copy_children_locked(conn: sqlite3.Connection, source_id: str, target_id: str) -> int:
    """Copy the children of ``source_id`` whose delegating tool call the fork ``target_id``
    holds (all of them when it copied the whole history), each under a new id with its rows,
    inside the fork's open write transaction. Returns how many were copied."""
    copied = 0
    for child in read_children(conn, source_id):
        tool_id = child.parent_tool_id
        if tool_id is not None and conn.execute(_HAS_ITEM, (target_id, tool_id)).fetchone() is None:
            continue
        copy = attrs.evolve(child, id=uuid.uuid4().hex, parent_id=target_id)
        _tasks.insert_task(conn, copy)
        _history.copy_items_locked(conn, child.id, copy.id, None)
        copied += 1
    return copied
