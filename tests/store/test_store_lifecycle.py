"""Opening, migrating, closing, the schema's exact columns, concurrency and cancellation."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio
import trio.testing

from maple_acp.model import ItemKind, TaskQuery, TimelineItem
from maple_acp.store import SqliteTaskStore, StoreError
from maple_acp.store._migrations import SCHEMA_VERSION, migrate
from maple_acp.testing.store import open_temp_store, task_record, temp_store

#: The documented columns of every table. A column added for anything else — above all
#: anything credential-like a connection supplies — fails here and has to be argued for.
DOCUMENTED_SCHEMA = {
    "tasks": [
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
    ],
    "items": [
        "id",
        "task_id",
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
        "images",
        "signature",
    ],
    "usage": [
        "task_id",
        "run_id",
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
    ],
    "trust": ["account", "root", "trusted", "updated_ms"],
    "goals": [
        "task_id",
        "objective",
        "status",
        "iterations",
        "last_reason",
        "created_ms",
        "updated_ms",
        "token_budget",
        "tokens_used",
    ],
    "forks": ["task_id", "copied_seq"],
    "blobs": ["sha256", "data"],
    "blob_refs": ["task_id", "sha256"],
    "transcripts": ["task_id", "run_id", "covered_seq", "body"],
    "prompt_keys": ["task_id", "key", "message_id", "seq"],
}


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


async def test_schema_has_exactly_the_documented_tables_and_columns(
    store_path: Path, tmp_path: Path
) -> None:
    await (await open_temp_store(tmp_path)).aclose()
    conn = raw(store_path)
    try:
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        }
        assert tables == set(DOCUMENTED_SCHEMA)
        for table, columns in DOCUMENTED_SCHEMA.items():
            found = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            assert found == columns, table
    finally:
        conn.close()


async def test_a_new_file_is_in_wal_mode_at_the_newest_version(
    store_path: Path, tmp_path: Path
) -> None:
    async with temp_store(tmp_path):
        pass
    conn = raw(store_path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()


async def test_data_survives_close_and_reopen(tmp_path: Path) -> None:
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        await store.admit_user_message(
            "t", TimelineItem(item_id="m", kind=ItemKind.USER, created_ms=1, text="hi"), now_ms=2
        )
    async with temp_store(tmp_path) as store:
        assert [i.text for i in await store.history("t")] == ["hi"]


async def test_a_file_at_the_first_version_is_migrated_with_its_data(
    store_path: Path, tmp_path: Path
) -> None:
    assert SCHEMA_VERSION >= 2
    conn = raw(store_path)
    try:
        # Version 1 has the tables but not the list indexes.
        migrate(conn, target=1)
        conn.execute(
            "INSERT INTO tasks VALUES ('old', 'account', '/project', 'kept', 0, 1, 5, "
            "'caller_mediated', 'desktop', NULL, 0, 0, NULL)"
        )
        indexes_before = conn.execute(
            "SELECT COUNT(*) FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL"
        ).fetchone()[0]
    finally:
        conn.close()
    async with temp_store(tmp_path) as store:
        page = await store.list_tasks(TaskQuery(account="account"))
        assert [(t.id, t.title) for t in page.tasks] == [("old", "kept")]
    conn = raw(store_path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        indexes_after = conn.execute(
            "SELECT COUNT(*) FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL"
        ).fetchone()[0]
        assert indexes_after > indexes_before
    finally:
        conn.close()


async def test_a_file_from_a_newer_version_is_refused_untouched(
    store_path: Path, tmp_path: Path
) -> None:
    conn = raw(store_path)
    try:
        conn.execute("CREATE TABLE future (x)")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    finally:
        conn.close()
    with pytest.raises(StoreError, match="newer version"):
        await open_temp_store(tmp_path)
    conn = raw(store_path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        assert conn.execute("SELECT name FROM sqlite_schema").fetchall() == [("future",)]
    finally:
        conn.close()


async def test_a_file_that_is_not_a_database_is_refused(store_path: Path, tmp_path: Path) -> None:
    await trio.Path(store_path).write_bytes(b"this is not an SQLite database, just text\n" * 100)
    with pytest.raises(StoreError):
        await open_temp_store(tmp_path)


async def test_a_missing_directory_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        await SqliteTaskStore.open(tmp_path / "no" / "such" / "dir" / "tasks.sqlite3")


async def test_a_closed_store_refuses_calls_and_closes_twice(tmp_path: Path) -> None:
    store = await open_temp_store(tmp_path)
    await store.aclose()
    await store.aclose()
    with pytest.raises(StoreError, match="closed"):
        await store.get_task("t")
    with pytest.raises(StoreError, match="closed"):
        await store.create_task(task_record(id="t"))


async def test_many_concurrent_writers_give_a_consistent_timeline(tmp_path: Path) -> None:
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="shared"))

        async def writer(n: int) -> None:
            await store.create_task(task_record(id=f"own-{n}", updated_ms=n))
            for k in range(5):
                await store.upsert_items(
                    "shared",
                    [
                        TimelineItem(
                            item_id=f"w{n}-{k}",
                            kind=ItemKind.ASSISTANT,
                            created_ms=k,
                            text=str(k),
                        )
                    ],
                    now_ms=10_000 + n,
                )
                await store.rename_task(f"own-{n}", f"v{k}", user_renamed=True, now_ms=k)

        async with trio.open_nursery() as nursery:
            for n in range(40):
                nursery.start_soon(writer, n)

        history = await store.history("shared")
        assert [i.seq for i in history] == list(range(1, 201))
        assert len({i.item_id for i in history}) == 200
        # Each writer's own items keep that writer's order.
        for n in range(40):
            mine = [i.item_id for i in history if i.item_id.startswith(f"w{n}-")]
            assert mine == [f"w{n}-{k}" for k in range(5)]
        for n in range(40):
            task = await store.get_task(f"own-{n}")
            assert task is not None
            assert task.title == "v4"


async def test_a_cancelled_call_finishes_its_transaction(store_path: Path, tmp_path: Path) -> None:
    async with temp_store(tmp_path) as store:
        # Another connection holds the write lock, so the store's write is parked inside
        # its worker thread (in SQLite's busy wait) when the caller is cancelled.
        blocker = raw(store_path)
        blocker.execute("BEGIN IMMEDIATE")
        outcome: list[str] = []

        async def create(task_id: str) -> None:
            with trio.CancelScope() as scope:
                scopes[task_id] = scope
                await store.create_task(task_record(id=task_id))
                outcome.append(f"{task_id} returned")
            if scope.cancelled_caught:
                outcome.append(f"{task_id} cancelled")

        scopes: dict[str, trio.CancelScope] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, "running")
            await trio.testing.wait_all_tasks_blocked()
            # A second call waits for the connection; cancelling it must write nothing.
            nursery.start_soon(create, "waiting")
            await trio.testing.wait_all_tasks_blocked()
            scopes["running"].cancel()
            scopes["waiting"].cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert outcome == ["waiting cancelled"]
            blocker.execute("COMMIT")
        blocker.close()
        # The running call completed and returned its result: the caller sees the
        # cancellation only at its next checkpoint, and knows the write happened.
        assert outcome == ["waiting cancelled", "running returned"]
        assert await store.get_task("running") == task_record(id="running")
        assert await store.get_task("waiting") is None


async def test_a_new_store_file_is_private_to_its_owner(store_path: Path, tmp_path: Path) -> None:
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        wal = store_path.with_name(store_path.name + "-wal")
        for path in (store_path, wal):
            assert (await trio.Path(path).stat()).st_mode & 0o077 == 0, path


async def test_an_existing_file_keeps_its_mode(store_path: Path, tmp_path: Path) -> None:
    async with temp_store(tmp_path):
        pass
    await trio.Path(store_path).chmod(0o640)
    async with temp_store(tmp_path):
        pass
    assert (await trio.Path(store_path).stat()).st_mode & 0o777 == 0o640


async def test_a_retried_admission_does_not_duplicate_the_message(
    store: SqliteTaskStore,
) -> None:
    await store.create_task(task_record(id="t"))
    message = TimelineItem(item_id="m", kind=ItemKind.USER, created_ms=1, text="hi")
    await store.admit_user_message("t", message, now_ms=2)
    await store.upsert_items(
        "t", [TimelineItem(item_id="a", kind=ItemKind.ASSISTANT, created_ms=3)], now_ms=3
    )
    await store.admit_user_message("t", message, now_ms=4)
    assert [(i.item_id, i.seq) for i in await store.history("t")] == [("m", 1), ("a", 2)]


async def test_items_keep_their_rows_and_order_when_the_table_is_rebuilt_by_run(
    store_path: Path, tmp_path: Path
) -> None:
    conn = raw(store_path)
    try:
        # Version 3 identified an item by its id within the task alone.
        migrate(conn, target=3)
        conn.execute(
            "INSERT INTO tasks VALUES ('t', 'account', '/p', '', 0, 1, 1, "
            "'caller_mediated', 'desktop', NULL, 0, 0, NULL)"
        )
        for seq, item_id, run_id in ((1, "b", "r1"), (2, "a", "r1"), (3, "c", None)):
            conn.execute(
                "INSERT INTO items (task_id, seq, item_id, kind, run_id, created_ms, text, "
                "plan) VALUES ('t', ?, ?, 'plan', ?, 5, '', ?)",
                (
                    seq,
                    item_id,
                    run_id,
                    f'[{{"content": "{item_id}", "priority": "low", "status": "completed"}}]',
                ),
            )
    finally:
        conn.close()
    async with temp_store(tmp_path) as store:
        history = await store.history("t")
        assert [(i.seq, i.item_id, i.run_id, i.plan[0].content) for i in history] == [
            (1, "b", "r1", "b"),
            (2, "a", "r1", "a"),
            (3, "c", None, "c"),
        ]
        # The rebuilt table still cascades from its task.
        assert await store.delete_task("t")
    conn = raw(store_path)
    try:
        indexes = {
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'items'"
            )
        }
        assert "items_by_run" in indexes
        assert conn.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 0
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()


async def test_items_become_a_rowid_table_with_their_rows_and_order(
    store_path: Path, tmp_path: Path
) -> None:
    # Version 4 kept whole rows in a WITHOUT ROWID b-tree; a long row there slowed every insert
    # near it (see migration step 5). The rebuilt table keeps every row, value and order.
    long_text = "l" * 300_000
    conn = raw(store_path)
    try:
        migrate(conn, target=4)
        for task in ("t", "u"):
            conn.execute(
                "INSERT INTO tasks VALUES (?, 'account', '/p', '', 0, 1, 1, "
                "'caller_mediated', 'desktop', NULL, 0, 0, NULL)",
                (task,),
            )
        rows = [("u", 1, "x", "assistant", "r9", "other task")]
        rows += [("t", 3, "c", "assistant", None, "third"), ("t", 1, "a", "user", "r1", long_text)]
        rows += [("t", 2, "b", "thought", "r1", "second")]
        for task, seq, item_id, kind, run_id, text in rows:
            conn.execute(
                "INSERT INTO items (task_id, seq, item_id, kind, run_id, created_ms, text) "
                "VALUES (?, ?, ?, ?, ?, 5, ?)",
                (task, seq, item_id, kind, run_id, text),
            )
    finally:
        conn.close()
    async with temp_store(tmp_path) as store:
        history = await store.history("t")
        assert [(i.seq, i.item_id, i.kind, i.run_id, i.text) for i in history] == [
            (1, "a", ItemKind.USER, "r1", long_text),
            (2, "b", ItemKind.THOUGHT, "r1", "second"),
            (3, "c", ItemKind.ASSISTANT, None, "third"),
        ]
        # New rows go after the migrated ones; a known id is still replaced in place.
        await store.upsert_items(
            "t",
            [
                TimelineItem(item_id="b", kind=ItemKind.THOUGHT, created_ms=6, run_id="r1"),
                TimelineItem(item_id="d", kind=ItemKind.ASSISTANT, created_ms=6, text="fourth"),
            ],
            now_ms=6,
        )
        assert [(i.seq, i.item_id) for i in await store.history("t")] == [
            (1, "a"),
            (2, "b"),
            (3, "c"),
            (4, "d"),
        ]
        assert await store.delete_task("t")
        assert [i.text for i in await store.history("u")] == ["other task"]
    conn = raw(store_path)
    try:
        (sql,) = conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'items'").fetchone()
        assert "WITHOUT ROWID" not in sql.upper()
        indexes = {
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'items'"
            )
        }
        assert {"items_by_seq", "items_by_run"} <= indexes
        assert conn.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 1
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
