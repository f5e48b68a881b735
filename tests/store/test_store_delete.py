"""Deleting a task is complete and durable: its history (plans included), goal and usage go,
project trust stays, and no later open of the file lists or returns it, even after the
deleting process was killed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from crash_writer import kill_writer_after

from maple_acp.model import (
    GoalRecord,
    GoalStatus,
    ItemKind,
    PlanEntry,
    TaskQuery,
    TaskSurface,
    TimelineItem,
    ToolState,
    ToolStatus,
    Usage,
)
from maple_acp.store import SqliteTaskStore
from maple_acp.testing.store import STORE_FILE_NAME, task_record, temp_store

#: Generous: the child only has to import trio and write a few transactions.
WRITER_TIMEOUT_S = 30
#: Every table with a task_id column, and so every place a deleted task could linger.
TASK_TABLES = ("items", "usage", "goals", "forks")


async def fill(store: SqliteTaskStore, task_id: str, *, archived: bool = False) -> None:
    await store.create_task(task_record(id=task_id, root="/project"))
    await store.admit_user_message(
        task_id,
        TimelineItem(item_id="u", kind=ItemKind.USER, created_ms=1, run_id="r", text="hi"),
        now_ms=2_000,
    )
    await store.upsert_items(
        task_id,
        [
            TimelineItem(item_id="a", kind=ItemKind.ASSISTANT, created_ms=2, run_id="r", text="x"),
            TimelineItem(
                item_id="p",
                kind=ItemKind.PLAN,
                created_ms=3,
                run_id="r",
                plan=(PlanEntry(content="step"),),
            ),
            TimelineItem(
                item_id="c",
                kind=ItemKind.TOOL,
                created_ms=4,
                run_id="r",
                tool=ToolState(name="shell", status=ToolStatus.COMPLETED),
            ),
        ],
        now_ms=3_000,
    )
    await store.record_usage(task_id, "r", Usage(input_tokens=5))
    await store.put_goal(
        task_id, GoalRecord(objective="o", status=GoalStatus.PAUSED, created_ms=1, updated_ms=1)
    )
    if archived:
        await store.set_archived(task_id, True, now_ms=4_000)


async def every_listed_id(store: SqliteTaskStore) -> set[str]:
    """Ids of every task of the account, hidden ones included, following every page."""
    seen: set[str] = set()
    for root in (None, "/project"):
        cursor = None
        while True:
            page = await store.list_tasks(
                TaskQuery(
                    account="account",
                    root=root,
                    include_provisional=True,
                    include_archived=True,
                    cursor=cursor,
                    limit=1,
                )
            )
            seen.update(t.id for t in page.tasks)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
    return seen


def rows_of(path: Path, task_id: str) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        counts = {
            table: conn.execute(
                f"SELECT COUNT(*) FROM {table} WHERE task_id = ?", (task_id,)
            ).fetchone()[0]
            for table in TASK_TABLES
        }
        counts["tasks"] = conn.execute(
            "SELECT COUNT(*) FROM tasks WHERE id = ?", (task_id,)
        ).fetchone()[0]
        return counts
    finally:
        conn.close()


async def assert_gone(store: SqliteTaskStore, task_id: str) -> None:
    assert await store.get_task(task_id) is None
    assert task_id not in await every_listed_id(store)
    assert await store.history(task_id) == []
    assert await store.item_count(task_id) == 0
    assert await store.get_goal(task_id) is None
    assert await store.run_usage(task_id, "r") is None


async def test_a_deleted_task_is_gone_after_a_reopen_and_trust_stays(tmp_path: Path) -> None:
    async with temp_store(tmp_path) as store:
        await fill(store, "gone")
        await fill(store, "kept", archived=True)
        await store.set_trust("account", "/project", True, now_ms=5)
        assert await store.delete_task("gone") is True
        await assert_gone(store, "gone")
    assert rows_of(tmp_path / STORE_FILE_NAME, "gone") == {t: 0 for t in (*TASK_TABLES, "tasks")}
    async with temp_store(tmp_path) as store:
        await assert_gone(store, "gone")
        # Deleting again finds nothing; the neighbour and the project's trust are untouched.
        assert await store.delete_task("gone") is False
        assert await every_listed_id(store) == {"kept"}
        assert [i.item_id for i in await store.history("kept")] == ["u", "a", "p", "c"]
        assert await store.get_goal("kept") is not None
        assert await store.get_trust("account", "/project") is True


async def test_a_deleted_id_can_be_created_again_without_its_old_rows(tmp_path: Path) -> None:
    async with temp_store(tmp_path) as store:
        await fill(store, "t")
        assert await store.delete_task("t") is True
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t", surface=TaskSurface.EXTERNAL))
        assert await store.history("t") == []
        assert await store.get_goal("t") is None


async def test_a_deletion_survives_the_process_being_killed(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE_NAME
    await kill_writer_after(
        b"DELETED\n", str(path), "task", "hello", "delete", marker_within_s=WRITER_TIMEOUT_S
    )
    async with temp_store(tmp_path) as store:
        await assert_gone(store, "task")
        # The process did go on writing after the deletion: the kill hit a live writer.
        assert await store.get_task("task-other") is not None
    assert rows_of(path, "task") == {t: 0 for t in (*TASK_TABLES, "tasks")}
