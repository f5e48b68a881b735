"""Prompt idempotency keys (schema 11): recorded with their user message in one transaction,
read back after a reopen, the oldest forgotten past the 1,024 a task keeps, gone with their
task; a file of schema 10 gains the table with its tasks keyless."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from maple_acp.model import ItemKind, TimelineItem
from maple_acp.store._migrations import SCHEMA_VERSION, migrate
from maple_acp.store._prompt_keys import MAX_PROMPT_KEYS
from maple_acp.testing.store import task_record, temp_store


def user(item_id: str) -> TimelineItem:
    return TimelineItem(
        item_id=item_id, kind=ItemKind.USER, created_ms=1, run_id=item_id, text="hi"
    )


async def test_a_key_names_its_message_across_a_reopen_and_only_in_its_task(
    tmp_path: Path,
) -> None:
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        await store.create_task(task_record(id="u"))
        await store.admit_user_message("t", user("m1"), now_ms=2, idempotency_key="k")
        await store.admit_user_message("t", user("m2"), now_ms=3)
        assert await store.keyed_message("t", "k") == "m1"
    async with temp_store(tmp_path) as store:
        assert await store.keyed_message("t", "k") == "m1"
        assert await store.keyed_message("u", "k") is None
        assert await store.keyed_message("t", "other") is None
        assert await store.delete_task("t")
        assert await store.keyed_message("t", "k") is None


async def test_the_key_past_the_limit_forgets_the_oldest(tmp_path: Path) -> None:
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        for n in range(MAX_PROMPT_KEYS):
            await store.admit_user_message("t", user(f"m{n}"), now_ms=2, idempotency_key=f"k{n}")
        assert await store.keyed_message("t", "k0") == "m0"
        await store.admit_user_message(
            "t", user("last"), now_ms=3, idempotency_key=f"k{MAX_PROMPT_KEYS}"
        )
        assert await store.keyed_message("t", "k0") is None
        assert await store.keyed_message("t", "k1") == "m1"
        assert await store.keyed_message("t", f"k{MAX_PROMPT_KEYS}") == "last"
    with sqlite3.connect(tmp_path / "tasks.sqlite3") as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM prompt_keys").fetchone()
    assert count == MAX_PROMPT_KEYS


async def test_a_schema_10_file_gains_the_table(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        # A file as schema 10 wrote it, then brought up to date.
        migrate(conn, target=10)
        assert migrate(conn) == 10
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema")}
        assert "prompt_keys" in tables
    finally:
        conn.close()
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        assert await store.keyed_message("t", "k") is None
        await store.admit_user_message("t", user("m1"), now_ms=2, idempotency_key="k")
        assert await store.keyed_message("t", "k") == "m1"
