"""A thought's provider signature (schema 9): kept with its row across a reopen and an update,
read back by the full history read (a signed thought is not a plain text row there), copied
by a fork; a file of schema 8 gains the column with its old rows unsigned."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from maple_acp.model import ItemKind, TimelineItem
from maple_acp.store._migrations import SCHEMA_VERSION, migrate
from maple_acp.testing.store import task_record, temp_store

SIGNATURE = "c2lnbmVkIHRoaW5raW5n"


def thought(item_id: str, text: str, signature: str | None) -> TimelineItem:
    return TimelineItem(
        item_id=item_id,
        kind=ItemKind.THOUGHT,
        created_ms=1,
        run_id="r",
        text=text,
        signature=signature,
    )


async def test_a_signed_thought_keeps_its_signature_across_a_reopen_and_a_fork(
    tmp_path: Path,
) -> None:
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        await store.upsert_items(
            "t", [thought("m1", "Consider", None), thought("m2", "plain", None)], now_ms=2
        )
        # The signature comes when the thinking block ends: the row is written again with it.
        await store.upsert_items("t", [thought("m1", "Consider alpha", SIGNATURE)], now_ms=3)
        await store.fork_task("t", task_record(id="f"), up_to=None)
    async with temp_store(tmp_path) as store:
        for task_id in ("t", "f"):
            first, second = await store.history(task_id)
            assert (first.text, first.signature) == ("Consider alpha", SIGNATURE)
            assert (second.text, second.signature) == ("plain", None)


async def test_a_schema_8_file_gains_the_column_with_its_rows_unsigned(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite3"
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        await store.upsert_items("t", [thought("m1", "old thinking", None)], now_ms=2)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        # Undo step 13 (child sessions) first: a later step's columns go before an earlier's.
        conn.execute("DROP INDEX tasks_by_parent")
        conn.execute("ALTER TABLE tasks DROP COLUMN parent_tool_id")
        conn.execute("ALTER TABLE tasks DROP COLUMN parent_id")
        conn.execute("ALTER TABLE items DROP COLUMN signature")
        conn.execute("DROP TABLE transcripts")
        conn.execute("DROP TABLE prompt_keys")
        conn.execute("ALTER TABLE tasks DROP COLUMN boolean_options")
        conn.execute("PRAGMA user_version = 8")
        assert migrate(conn) == 8
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()
    async with temp_store(tmp_path) as store:
        [item] = await store.history("t")
    assert (item.text, item.signature) == ("old thinking", None)
