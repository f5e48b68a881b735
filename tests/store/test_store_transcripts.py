"""What a provider engine sent for a run (schema 10): kept per run across a reopen, replaced
by a later one of the same run, dropped from the answer once the run has rows it does not
cover (a later turn of the run that failed), gone with its task; a file of schema 9 gains the
table with nothing in it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from maple_acp.model import ItemKind, TimelineItem
from maple_acp.store._migrations import SCHEMA_VERSION, migrate
from maple_acp.testing.store import task_record, temp_store


def row(item_id: str, run_id: str, kind: ItemKind = ItemKind.ASSISTANT) -> TimelineItem:
    return TimelineItem(item_id=item_id, kind=kind, created_ms=1, run_id=run_id, text=item_id)


async def test_a_transcript_covers_its_run_until_the_run_has_more_rows(tmp_path: Path) -> None:
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        await store.upsert_items("t", [row("u1", "r1", ItemKind.USER), row("a1", "r1")], now_ms=2)
        await store.put_transcript("t", "r1", b"first")
        await store.upsert_items("t", [row("u2", "r2", ItemKind.USER), row("a2", "r2")], now_ms=3)
        await store.put_transcript("t", "r2", b"second")
        assert await store.transcripts("t") == {"r1": b"first", "r2": b"second"}
        # A row rewritten in place keeps its place: still covered.
        await store.upsert_items("t", [row("a1", "r1")], now_ms=4)
        assert await store.transcripts("t") == {"r1": b"first", "r2": b"second"}
    async with temp_store(tmp_path) as store:
        assert await store.transcripts("t") == {"r1": b"first", "r2": b"second"}
        # The run went on past what its transcript says: rebuilt from its rows from now on.
        await store.upsert_items("t", [row("a3", "r2")], now_ms=5)
        assert await store.transcripts("t") == {"r1": b"first"}
        # ... until a later transcript covers it again.
        await store.put_transcript("t", "r2", b"second, whole")
        assert await store.transcripts("t") == {"r1": b"first", "r2": b"second, whole"}
        assert await store.transcripts("other") == {}
        await store.delete_task("t")
        conn = sqlite3.connect(tmp_path / "tasks.sqlite3")
        try:
            assert conn.execute("SELECT COUNT(*) FROM transcripts").fetchone()[0] == 0
        finally:
            conn.close()


async def test_a_schema_9_file_gains_an_empty_table(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite3"
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        await store.upsert_items("t", [row("u1", "r1", ItemKind.USER)], now_ms=2)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        # Undo step 13 (child sessions) first: a later step's columns go before an earlier's.
        conn.execute("DROP INDEX tasks_by_parent")
        conn.execute("ALTER TABLE tasks DROP COLUMN parent_tool_id")
        conn.execute("ALTER TABLE tasks DROP COLUMN parent_id")
        conn.execute("DROP TABLE transcripts")
        conn.execute("DROP TABLE prompt_keys")
        conn.execute("ALTER TABLE tasks DROP COLUMN boolean_options")
        conn.execute("PRAGMA user_version = 9")
        assert migrate(conn) == 9
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()
    async with temp_store(tmp_path) as store:
        assert await store.transcripts("t") == {}
        assert [item.item_id for item in await store.history("t")] == ["u1"]
