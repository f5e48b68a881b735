"""A task's session mode, thinking effort and additional directories: stored, read back, kept
by a migration of an older file, and never taken for activity."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from maple_acp.model import TaskQuery
from maple_acp.store import SqliteTaskStore, StoreError
from maple_acp.store._migrations import migrate
from maple_acp.testing.store import task_record, temp_store

#: The version before the task settings' columns.
BEFORE_SETTINGS = 5


async def test_settings_and_directories_round_trip(store: SqliteTaskStore) -> None:
    stored = task_record(
        id="t",
        mode="plan",
        thought_level="high",
        additional_directories=("/also", "/and/this"),
    )
    await store.create_task(stored)
    assert await store.get_task("t") == stored
    page = await store.list_tasks(TaskQuery(account="account"))
    assert page.tasks == (stored,)


async def test_setting_the_mode_or_level_keeps_updated_ms(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t", updated_ms=1000))
    moded = await store.set_task_mode("t", "ask")
    assert moded is not None
    assert (moded.mode, moded.thought_level, moded.updated_ms) == ("ask", None, 1000)
    levelled = await store.set_task_thought_level("t", "low")
    assert levelled is not None
    assert (levelled.mode, levelled.thought_level, levelled.updated_ms) == ("ask", "low", 1000)
    cleared = await store.set_task_mode("t", None)
    assert cleared is not None
    assert cleared.mode is None
    assert await store.get_task("t") == cleared
    assert await store.set_task_mode("missing", "ask") is None
    assert await store.set_task_thought_level("missing", "low") is None


async def test_a_resume_replaces_the_directories_and_keeps_updated_ms(
    store: SqliteTaskStore,
) -> None:
    await store.create_task(task_record(id="t", updated_ms=1000, additional_directories=("/a",)))
    moved = await store.set_task_directories("t", ("/b", "/c"))
    assert moved is not None
    assert (moved.additional_directories, moved.updated_ms) == (("/b", "/c"), 1000)
    assert await store.get_task("t") == moved
    cleared = await store.set_task_directories("t", ())
    assert cleared is not None
    assert cleared.additional_directories == ()
    assert await store.set_task_directories("missing", ("/a",)) is None


async def test_a_file_before_the_settings_is_migrated_with_defaults(
    store_path: Path, tmp_path: Path
) -> None:
    conn = sqlite3.connect(store_path, isolation_level=None)
    try:
        migrate(conn, target=BEFORE_SETTINGS)
        conn.execute(
            "INSERT INTO tasks VALUES ('old', 'account', '/project', 'kept', 0, 1, 5, "
            "'caller_mediated', 'desktop', 'm', 0, 0, NULL)"
        )
    finally:
        conn.close()
    async with temp_store(tmp_path) as store:
        task = await store.get_task("old")
        assert task is not None
        assert (task.title, task.model, task.updated_ms) == ("kept", "m", 5)
        assert (task.mode, task.thought_level, task.additional_directories) == (None, None, ())
        moded = await store.set_task_mode("old", "auto-edit")
        assert moded is not None
        assert moded.mode == "auto-edit"


async def test_a_malformed_directory_list_is_a_store_error(
    store_path: Path, tmp_path: Path
) -> None:
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
    conn = sqlite3.connect(store_path, isolation_level=None)
    try:
        conn.execute("UPDATE tasks SET additional_directories = '[1]' WHERE id = 't'")
    finally:
        conn.close()
    async with temp_store(tmp_path) as store:
        with pytest.raises(StoreError, match="directory list"):
            await store.get_task("t")


async def test_boolean_options_are_stored_whole_and_keep_updated_ms(
    store: SqliteTaskStore,
) -> None:
    await store.create_task(task_record(id="t", updated_ms=1000))
    assert (await store.get_task("t")).boolean_options == ()  # type: ignore[union-attr]
    switched = await store.set_task_boolean_options("t", (("brief", True), ("loud", False)))
    assert switched is not None
    assert (switched.boolean_options, switched.updated_ms) == (
        (("brief", True), ("loud", False)),
        1000,
    )
    assert await store.get_task("t") == switched
    assert await store.set_task_boolean_options("missing", (("brief", True),)) is None


async def test_a_file_before_boolean_options_gains_none_set(
    store_path: Path, tmp_path: Path
) -> None:
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t", mode="plan"))
    conn = sqlite3.connect(store_path, isolation_level=None)
    try:
        # Undo step 13 (child sessions) first: a later step's columns go before an earlier's.
        conn.execute("DROP INDEX tasks_by_parent")
        conn.execute("ALTER TABLE tasks DROP COLUMN parent_tool_id")
        conn.execute("ALTER TABLE tasks DROP COLUMN parent_id")
        conn.execute("ALTER TABLE tasks DROP COLUMN boolean_options")
        conn.execute("PRAGMA user_version = 11")
        assert migrate(conn) == 11
    finally:
        conn.close()
    async with temp_store(tmp_path) as store:
        task = await store.get_task("t")
        assert task is not None
        assert (task.mode, task.boolean_options) == ("plan", ())


async def test_malformed_boolean_options_are_a_store_error(
    store_path: Path, tmp_path: Path
) -> None:
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
    conn = sqlite3.connect(store_path, isolation_level=None)
    try:
        conn.execute("""UPDATE tasks SET boolean_options = '{"brief": "yes"}' WHERE id = 't'""")
    finally:
        conn.close()
    async with temp_store(tmp_path) as store:
        with pytest.raises(StoreError, match="boolean options"):
            await store.get_task("t")
