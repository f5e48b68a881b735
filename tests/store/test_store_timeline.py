"""Timeline items: admission of user messages, upserts, ordering and raw JSON values."""

from __future__ import annotations

import attrs
import pytest

from maple_acp.model import (
    ItemKind,
    TaskSurface,
    TimelineItem,
    ToolLocation,
    ToolState,
    ToolStatus,
)
from maple_acp.store import SqliteTaskStore, StoreError
from maple_acp.testing.store import task_record


def text(item_id: str, kind: ItemKind = ItemKind.ASSISTANT, body: str = "x") -> TimelineItem:
    return TimelineItem(item_id=item_id, kind=kind, created_ms=1, text=body, run_id="r1")


def tool(item_id: str, status: ToolStatus, **fields: object) -> TimelineItem:
    return TimelineItem(
        item_id=item_id,
        kind=ItemKind.TOOL,
        created_ms=1,
        run_id="r1",
        text="run ls",
        tool=ToolState(name="shell", status=status, **fields),  # type: ignore[arg-type]
    )


async def test_admit_appends_ends_provisional_and_bumps_updated(store: SqliteTaskStore) -> None:
    await store.create_task(
        task_record(
            id="p", surface=TaskSurface.EXTERNAL, provisional=True, provisional_expires_ms=50
        )
    )
    record = await store.admit_user_message("p", text("m1", ItemKind.USER, "hello"), now_ms=2_000)
    assert (record.provisional, record.provisional_expires_ms, record.updated_ms) == (
        False,
        None,
        2_000,
    )
    assert await store.get_task("p") == record
    [stored] = await store.history("p")
    assert (stored.item_id, stored.kind, stored.text, stored.seq) == (
        "m1",
        ItemKind.USER,
        "hello",
        1,
    )


async def test_admit_to_a_missing_task_fails_and_writes_nothing(store: SqliteTaskStore) -> None:
    with pytest.raises(StoreError):
        await store.admit_user_message("missing", text("m", ItemKind.USER), now_ms=1)
    assert await store.item_count("missing") == 0


async def test_admit_refuses_a_non_user_item(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    with pytest.raises(ValueError, match="user"):
        await store.admit_user_message("t", text("a", ItemKind.ASSISTANT), now_ms=1)
    assert await store.item_count("t") == 0


async def test_new_items_come_after_every_existing_one_in_order(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    await store.admit_user_message("t", text("u1", ItemKind.USER), now_ms=2)
    await store.upsert_items("t", [text("a1"), text("th1", ItemKind.THOUGHT), text("a2")], now_ms=3)
    await store.admit_user_message("t", text("u2", ItemKind.USER), now_ms=4)
    await store.upsert_items("t", [text("a3")], now_ms=5)
    history = await store.history("t")
    assert [i.item_id for i in history] == ["u1", "a1", "th1", "a2", "u2", "a3"]
    assert [i.seq for i in history] == [1, 2, 3, 4, 5, 6]
    assert await store.item_count("t") == 6
    task = await store.get_task("t")
    assert task is not None
    assert task.updated_ms == 5


async def test_replacing_an_item_keeps_its_place(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    await store.upsert_items("t", [text("a1", body="Hel"), text("a2")], now_ms=2)
    await store.upsert_items("t", [text("a1", body="Hello"), text("a3")], now_ms=3)
    history = await store.history("t")
    assert [(i.item_id, i.text, i.seq) for i in history] == [
        ("a1", "Hello", 1),
        ("a2", "x", 2),
        ("a3", "x", 3),
    ]


async def test_item_ids_are_scoped_to_their_task(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t1"))
    await store.create_task(task_record(id="t2"))
    await store.upsert_items("t1", [text("same", body="one")], now_ms=2)
    await store.upsert_items("t2", [text("same", body="two")], now_ms=2)
    assert [i.text for i in await store.history("t1")] == ["one"]
    assert [i.text for i in await store.history("t2")] == ["two"]


async def test_tool_result_keeps_the_request_input(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    request = tool("c1", ToolStatus.PENDING, title="ls", raw_input={"command": "ls -la"})
    await store.upsert_items("t", [request], now_ms=2)
    result = tool(
        "c1",
        ToolStatus.COMPLETED,
        title="ls",
        raw_output={"exit": 0, "lines": ["a", "b"]},
        output_text="a\nb",
        locations=(ToolLocation(path="/project/a"), ToolLocation(path="/project/b", line=7)),
    )
    await store.upsert_items("t", [result], now_ms=3)
    [stored] = await store.history("t")
    assert stored.tool == ToolState(
        name="shell",
        status=ToolStatus.COMPLETED,
        title="ls",
        raw_input={"command": "ls -la"},
        raw_output={"exit": 0, "lines": ["a", "b"]},
        output_text="a\nb",
        locations=(ToolLocation(path="/project/a"), ToolLocation(path="/project/b", line=7)),
    )
    # A replacement that does carry an input replaces it.
    await store.upsert_items(
        "t", [tool("c1", ToolStatus.COMPLETED, raw_input={"command": "pwd"})], now_ms=4
    )
    [again] = await store.history("t")
    assert again.tool is not None
    assert again.tool.raw_input == {"command": "pwd"}
    assert again.tool.raw_output is None


async def test_json_values_round_trip(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    values = [0, -1.5, "text with \u2603 and \x00", True, [1, [2, {}]], {"k": None}]
    items = [
        tool(f"c{n}", ToolStatus.IN_PROGRESS, raw_input=value, raw_output=value)
        for n, value in enumerate(values)
    ]
    await store.upsert_items("t", items, now_ms=2)
    stored = [i.tool for i in await store.history("t")]
    assert [(s.raw_input, s.raw_output) for s in stored if s] == [(v, v) for v in values]


@pytest.mark.parametrize("bad", [{1, 2}, object(), {"k": b"bytes"}, {1: "int key"}, 2**70])
async def test_a_value_that_is_not_json_fails_before_anything_is_written(
    store: SqliteTaskStore, bad: object
) -> None:
    await store.create_task(task_record(id="t"))
    with pytest.raises(StoreError, match="JSON"):
        await store.upsert_items(
            "t", [text("ok"), tool("c", ToolStatus.PENDING, raw_input=bad)], now_ms=2
        )
    with pytest.raises(StoreError, match="JSON"):
        await store.upsert_items("t", [tool("c", ToolStatus.COMPLETED, raw_output=bad)], now_ms=2)
    assert await store.item_count("t") == 0
    assert await store.get_task("t") == task_record(id="t")
    # The store is still usable afterwards.
    await store.upsert_items("t", [text("ok")], now_ms=3)
    assert await store.item_count("t") == 1


async def test_upsert_to_a_missing_task_fails(store: SqliteTaskStore) -> None:
    with pytest.raises(StoreError):
        await store.upsert_items("missing", [text("a")], now_ms=1)
    assert await store.history("missing") == []


async def test_upsert_of_nothing_changes_nothing(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    await store.upsert_items("t", [], now_ms=99_000)
    assert await store.get_task("t") == task_record(id="t")


async def test_a_batch_failing_half_way_is_rolled_back_whole(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    await store.upsert_items("t", [text("a", body="before")], now_ms=2)
    # attrs does not check types, so a NULL text reaches SQLite and fails its NOT NULL
    # constraint after the first two rows of the batch were already written.
    broken = TimelineItem(item_id="c", kind=ItemKind.ASSISTANT, created_ms=1, text=None)  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        await store.upsert_items("t", [text("a", body="after"), text("b"), broken], now_ms=3)
    assert [(i.item_id, i.text) for i in await store.history("t")] == [("a", "before")]
    task = await store.get_task("t")
    assert task is not None
    assert task.updated_ms == 2


async def test_a_text_replacement_of_a_tool_row_drops_the_tool(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    await store.upsert_items(
        "t", [tool("x", ToolStatus.PENDING, raw_input={"command": "ls"})], now_ms=2
    )
    await store.upsert_items("t", [text("x", body="now text")], now_ms=3)
    [stored] = await store.history("t")
    assert (stored.kind, stored.text, stored.tool, stored.seq) == (
        ItemKind.ASSISTANT,
        "now text",
        None,
        1,
    )
    # A tool row replacing a text row has no stored input to keep.
    await store.upsert_items("t", [tool("x", ToolStatus.COMPLETED)], now_ms=4)
    [again] = await store.history("t")
    assert again.tool == ToolState(name="shell", status=ToolStatus.COMPLETED)


@pytest.mark.parametrize("status", list(ToolStatus))
async def test_every_tool_status_and_item_kind_round_trips(
    store: SqliteTaskStore, status: ToolStatus
) -> None:
    await store.create_task(task_record(id="t"))
    items = [
        TimelineItem(item_id=kind.value, kind=kind, created_ms=7, run_id=None, text=kind.value)
        for kind in ItemKind
        if kind is not ItemKind.TOOL
    ]
    items.append(tool("call", status, title="t", output_text="", locations=()))
    await store.upsert_items("t", items, now_ms=2)
    stored = await store.history("t")
    assert [attrs.evolve(i, seq=0) for i in stored] == items


async def test_an_item_is_identified_by_its_run_and_its_id(store: SqliteTaskStore) -> None:
    """The same id written by another run is another item: each run's rows stay where they
    were written, and a retried write of the same run still replaces in place."""
    await store.create_task(task_record(id="t"))
    first = TimelineItem(item_id="call-1", kind=ItemKind.ASSISTANT, created_ms=1, run_id="r1")
    await store.upsert_items("t", [attrs.evolve(first, text="one")], now_ms=2)
    await store.upsert_items("t", [attrs.evolve(first, run_id="r2", text="two")], now_ms=3)
    await store.upsert_items("t", [attrs.evolve(first, text="one again")], now_ms=4)
    # Items without a run form one run of their own.
    loose = TimelineItem(item_id="call-1", kind=ItemKind.USER, created_ms=1, text="loose")
    await store.upsert_items("t", [loose], now_ms=5)
    await store.upsert_items("t", [attrs.evolve(loose, text="loose again")], now_ms=6)
    history = await store.history("t")
    assert [(i.run_id, i.text, i.seq) for i in history] == [
        ("r1", "one again", 1),
        ("r2", "two", 2),
        (None, "loose again", 3),
    ]
