"""Plans, file diffs and tool locations: round trips through a real file, the kept-on-update
rule, the migration of locations written as plain paths, and malformed stored values."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from maple_acp.model import (
    FileDiff,
    ItemKind,
    PlanEntry,
    PlanPriority,
    PlanStatus,
    TimelineItem,
    ToolLocation,
    ToolState,
    ToolStatus,
)
from maple_acp.store import SqliteTaskStore, StoreError
from maple_acp.store._migrations import SCHEMA_VERSION, migrate
from maple_acp.testing.store import task_record, temp_store


def plan_item(item_id: str, *entries: PlanEntry) -> TimelineItem:
    return TimelineItem(item_id=item_id, kind=ItemKind.PLAN, created_ms=1, run_id="r", plan=entries)


def text_item(item_id: str, kind: ItemKind = ItemKind.ASSISTANT) -> TimelineItem:
    return TimelineItem(item_id=item_id, kind=kind, created_ms=1, text=item_id, run_id="r")


def tool_item(item_id: str, tool: ToolState) -> TimelineItem:
    return TimelineItem(item_id=item_id, kind=ItemKind.TOOL, created_ms=1, text="edit", tool=tool)


EDIT = ToolState(
    name="write_file",
    status=ToolStatus.PENDING,
    raw_input={"path": "/p/a.txt"},
    locations=(ToolLocation(path="/p/a.txt", line=3), ToolLocation(path="/p/b.txt")),
    diffs=(
        FileDiff(path="/p/a.txt", old_text="old\n", new_text="new ☃\n"),
        FileDiff(path="/p/b.txt", new_text="created", truncated=True),
    ),
)


async def test_a_tool_row_keeps_locations_and_diffs_across_a_reopen(tmp_path: Path) -> None:
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        await store.upsert_items("t", [tool_item("call", EDIT)], now_ms=2)
    async with temp_store(tmp_path) as store:
        [stored] = await store.history("t")
    assert stored.tool == EDIT
    # Order is part of the record, not only the set.
    assert stored.tool is not None
    assert [loc.path for loc in stored.tool.locations] == ["/p/a.txt", "/p/b.txt"]


async def test_a_result_update_keeps_the_requests_locations_and_diffs(
    store: SqliteTaskStore,
) -> None:
    await store.create_task(task_record(id="t"))
    await store.upsert_items("t", [tool_item("call", EDIT)], now_ms=2)
    result = ToolState(name="write_file", status=ToolStatus.COMPLETED, output_text="written")
    await store.upsert_items("t", [tool_item("call", result)], now_ms=3)
    [stored] = await store.history("t")
    assert stored.tool == ToolState(
        name="write_file",
        status=ToolStatus.COMPLETED,
        output_text="written",
        raw_input=EDIT.raw_input,
        locations=EDIT.locations,
        diffs=EDIT.diffs,
    )
    # An update that names its own locations and diffs replaces the stored ones.
    other = ToolState(
        name="write_file",
        status=ToolStatus.COMPLETED,
        locations=(ToolLocation(path="/p/c.txt", line=1),),
        diffs=(FileDiff(path="/p/c.txt", old_text="", new_text="c"),),
    )
    await store.upsert_items("t", [tool_item("call", other)], now_ms=4)
    [stored] = await store.history("t")
    assert stored.tool is not None
    assert (stored.tool.locations, stored.tool.diffs) == (other.locations, other.diffs)


async def test_plans_round_trip_and_the_latest_is_the_last_plan_in_history(
    tmp_path: Path,
) -> None:
    first = (
        PlanEntry(content="read the code"),
        PlanEntry(content="write tests", priority=PlanPriority.HIGH),
    )
    latest = (
        PlanEntry(content="read the code", status=PlanStatus.COMPLETED),
        PlanEntry(content="write tests", priority=PlanPriority.HIGH, status=PlanStatus.IN_PROGRESS),
        PlanEntry(content="tidy up", priority=PlanPriority.LOW),
    )
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        await store.admit_user_message("t", text_item("u1", ItemKind.USER), now_ms=2)
        await store.upsert_items(
            "t",
            [plan_item("plan-1", *first), text_item("a1"), plan_item("plan-2", *latest)],
            now_ms=3,
        )
        await store.upsert_items("t", [text_item("a2")], now_ms=4)
    async with temp_store(tmp_path) as store:
        history = await store.history("t")
    assert [i.item_id for i in history] == ["u1", "plan-1", "a1", "plan-2", "a2"]
    plans = [i for i in history if i.kind is ItemKind.PLAN]
    assert [p.plan for p in plans] == [first, latest]
    assert plans[-1].plan == latest
    # Rows of other kinds carry no plan.
    assert all(i.plan == () for i in history if i.kind is not ItemKind.PLAN)


async def test_an_emptied_plan_is_kept_as_an_empty_plan(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    await store.upsert_items(
        "t", [plan_item("p1", PlanEntry(content="x")), plan_item("p2")], now_ms=2
    )
    history = await store.history("t")
    assert [(i.kind, i.plan) for i in history] == [
        (ItemKind.PLAN, (PlanEntry(content="x"),)),
        (ItemKind.PLAN, ()),
    ]


def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def _write_version_2_file(
    path: Path, *tool_rows: tuple[str, str | None], then_assistant: bool = False
) -> None:
    """The file as version 2 left it: task ``t`` with one shell row per ``(item_id,
    locations)``, locations as version 2 wrote them (a JSON list of plain paths)."""
    conn = _raw(path)
    try:
        migrate(conn, target=2)
        conn.execute(
            "INSERT INTO tasks VALUES ('t', 'account', '/p', '', 0, 1, 1, "
            "'caller_mediated', 'desktop', NULL, 0, 0, NULL)"
        )
        for seq, (item_id, locations) in enumerate(tool_rows, start=1):
            conn.execute(
                "INSERT INTO items (task_id, seq, item_id, kind, created_ms, text, tool_name, "
                "tool_status, tool_title, locations) "
                "VALUES ('t', ?, ?, 'tool', 1, 's', 'shell', 'completed', '', ?)",
                (seq, item_id, locations),
            )
        if then_assistant:
            conn.execute(
                "INSERT INTO items (task_id, seq, item_id, kind, created_ms, text) "
                "VALUES ('t', ?, 'm', 'assistant', 1, 'hello')",
                (len(tool_rows) + 1,),
            )
    finally:
        conn.close()


async def test_locations_stored_as_plain_paths_are_migrated(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite3"
    _write_version_2_file(
        path,
        ("a", '["/p/one.py", "/p/two.py"]'),
        ("b", "[]"),
        ("c", None),
        then_assistant=True,
    )
    async with temp_store(tmp_path) as store:
        history = await store.history("t")
    tools = [i.tool for i in history]
    assert [t.locations if t else None for t in tools] == [
        (ToolLocation(path="/p/one.py"), ToolLocation(path="/p/two.py")),
        (),
        (),
        None,
    ]
    assert [t.diffs if t else None for t in tools] == [(), (), (), None]
    assert history[3].text == "hello"
    conn = _raw(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()


async def test_a_malformed_location_list_fails_the_migration_and_leaves_the_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tasks.sqlite3"
    _write_version_2_file(path, ("a", "{not json"))
    with pytest.raises(StoreError):
        async with temp_store(tmp_path):
            pass
    conn = _raw(path)
    try:
        # The failed step rolled back with its version: the file is still at version 2.
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
        columns = [row[1] for row in conn.execute("PRAGMA table_info(items)")]
        assert "plan" not in columns
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("locations", '[{"line": 3}]'),
        ("locations", '[{"path": "/p", "line": "3"}]'),
        ("locations", '{"path": "/p"}'),
        ("diffs", '[{"path": "/p", "new": 1, "old": null, "truncated": false}]'),
        ("diffs", '[{"path": "/p", "new": "x", "old": null}]'),
        ("plan", '[{"content": "x", "priority": "urgent", "status": "pending"}]'),
        ("plan", '[{"priority": "high", "status": "pending"}]'),
        ("plan", '"not a list"'),
    ],
)
async def test_a_malformed_stored_value_is_a_store_error(
    tmp_path: Path, column: str, value: str
) -> None:
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        await store.upsert_items("t", [tool_item("call", EDIT)], now_ms=2)
        conn = _raw(tmp_path / "tasks.sqlite3")
        try:
            conn.execute(f"UPDATE items SET {column} = ?", (value,))
        finally:
            conn.close()
        with pytest.raises(StoreError):
            await store.history("t")


async def test_a_markdown_plan_is_its_row_text_across_a_reopen(tmp_path: Path) -> None:
    markdown = "# Plan\n\n- [x] read\n- write ☃"
    item = TimelineItem(item_id="p1", kind=ItemKind.PLAN, created_ms=1, run_id="r", text=markdown)
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="t"))
        await store.upsert_items("t", [text_item("a1"), item], now_ms=2)
    async with temp_store(tmp_path) as store:
        history = await store.history("t")
        replay = await store.replay_rows("t")
    for rows in (history, replay):
        [plan] = [r for r in rows if isinstance(r, TimelineItem) and r.kind is ItemKind.PLAN]
        assert (plan.plan, plan.text) == ((), markdown)
