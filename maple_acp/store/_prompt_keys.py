"""Prompt idempotency keys: which user message a client's key inserted, per task.

A client that lost a prompt's answer sends the prompt again with the same key; the key's row
says the message is in already and which one it is. Written in the transaction that inserts
the message, so a crash never keeps one without the other.
"""

from __future__ import annotations

import sqlite3
from typing import Final

#: Keys remembered per task, newest kept: a retry comes soon after its original, and a task
#: prompted for years must not grow a row per prompt forever.
MAX_PROMPT_KEYS: Final = 1024


def remember_key_locked(conn: sqlite3.Connection, task_id: str, key: str, message_id: str) -> None:
    """Record that ``key`` inserted ``message_id`` in ``task_id``, and forget the task's keys
    older than the newest :data:`MAX_PROMPT_KEYS`. Runs inside the caller's transaction."""
    conn.execute(
        "INSERT OR REPLACE INTO prompt_keys (task_id, key, message_id, seq) VALUES "
        "(?, ?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM prompt_keys WHERE task_id = ?))",
        (task_id, key, message_id, task_id),
    )
    conn.execute(
        "DELETE FROM prompt_keys WHERE task_id = ? AND seq <= ("
        "SELECT seq FROM prompt_keys WHERE task_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
        (task_id, task_id, MAX_PROMPT_KEYS),
    )


def message_for_key(conn: sqlite3.Connection, task_id: str, key: str) -> str | None:
    row = conn.execute(
        "SELECT message_id FROM prompt_keys WHERE task_id = ? AND key = ?", (task_id, key)
    ).fetchone()
    return None if row is None else str(row[0])
