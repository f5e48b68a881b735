"""The store keeps the decoded histories of the tasks read last and brings them up to date
with its own writes: every read must equal what a fresh store reads from the file."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from maple_acp.model import (
    ItemKind,
    PlanEntry,
    PlanPriority,
    PlanStatus,
    TimelineItem,
    ToolLocation,
    ToolState,
    ToolStatus,
)
from maple_acp.store import SqliteTaskStore, _history
from maple_acp.store._history import MAX_CACHED_ITEMS, MAX_CACHED_TASKS, encode_items
from maple_acp.store._sqlite import _write
from maple_acp.testing.store import task_record


async def _fresh(path: Path, task_id: str) -> list[TimelineItem]:
    """What a cold read of the file returns: the store's own history read, on a connection
    of its own (a second store cannot open the file while the test's store holds it)."""
    conn = sqlite3.connect(path)
    try:
        return _history.read_history(conn, task_id)
    finally:
        conn.close()


def _random_item(rng: random.Random, index: int, run: str) -> TimelineItem:
    choice = rng.randrange(4)
    item_id = f"{run}-i{rng.randrange(index + 1)}"  # often an id written before: a replace
    if choice == 0:
        return TimelineItem(
            item_id=item_id, kind=ItemKind.ASSISTANT, created_ms=index, run_id=run, text="t" * index
        )
    if choice == 1:
        return TimelineItem(
            item_id=f"{run}-p{index}",
            kind=ItemKind.PLAN,
            created_ms=index,
            run_id=run,
            plan=(
                PlanEntry(
                    content=f"step {index}", priority=PlanPriority.LOW, status=PlanStatus.PENDING
                ),
            ),
        )
    status = rng.choice([ToolStatus.PENDING, ToolStatus.COMPLETED])
    raw = {"n": index} if rng.random() < 0.5 else None
    locations = (ToolLocation(path=f"/p/{index}", line=None),) if rng.random() < 0.5 else ()
    return TimelineItem(
        item_id=f"{run}-tool{rng.randrange(index + 1)}",
        kind=ItemKind.TOOL,
        created_ms=index,
        run_id=run,
        text="tool",
        tool=ToolState(
            name="shell", status=status, raw_input=raw, locations=locations, output_text=None
        ),
    )


async def test_reads_between_writes_equal_a_fresh_read(
    store: SqliteTaskStore, store_path: Path
) -> None:
    rng = random.Random(7)
    await store.create_task(task_record(id="t"))
    assert await store.history("t") == []
    for step in range(40):
        run = f"r{step % 3}"
        batch = [_random_item(rng, step * 5 + k, run) for k in range(rng.randrange(1, 6))]
        if rng.random() < 0.2:
            user = TimelineItem(
                item_id=f"u{step}", kind=ItemKind.USER, created_ms=step, text=f"prompt {step}"
            )
            await store.admit_user_message("t", user, now_ms=step)
        else:
            await store.upsert_items("t", batch, now_ms=step)
        if rng.random() < 0.5:
            assert await store.history("t") == await _fresh(store_path, "t")
    assert await store.history("t") == await _fresh(store_path, "t")


async def test_a_write_by_another_connection_is_seen(
    store: SqliteTaskStore, store_path: Path
) -> None:
    await store.create_task(task_record(id="t"))
    first = TimelineItem(item_id="a", kind=ItemKind.ASSISTANT, created_ms=1, text="one")
    await store.upsert_items("t", [first], now_ms=1)
    assert [item.text for item in await store.history("t")] == ["one"]
    # Another process writing the file (an administrator's tool: a second host cannot open
    # it), through the store's own row encoding.
    replaced = TimelineItem(item_id="a", kind=ItemKind.ASSISTANT, created_ms=1, text="two")
    other = sqlite3.connect(store_path, isolation_level=None)
    try:
        _write(
            other, lambda conn: _history.upsert_items_locked(conn, "t", encode_items([replaced]))
        )
    finally:
        other.close()
    assert [item.text for item in await store.history("t")] == ["two"]


async def test_a_deleted_task_has_no_history(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    item = TimelineItem(item_id="a", kind=ItemKind.ASSISTANT, created_ms=1, text="one")
    await store.upsert_items("t", [item], now_ms=1)
    assert len(await store.history("t")) == 1
    assert await store.delete_task("t")
    assert await store.history("t") == []


async def test_a_caller_changing_its_copy_changes_nothing_stored(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    item = TimelineItem(item_id="a", kind=ItemKind.ASSISTANT, created_ms=1, text="one")
    await store.upsert_items("t", [item], now_ms=1)
    copy = await store.history("t")
    copy.clear()
    assert len(await store.history("t")) == 1


async def test_a_history_too_large_to_keep_is_still_read_whole(
    store: SqliteTaskStore, store_path: Path
) -> None:
    await store.create_task(task_record(id="t"))
    items = [
        TimelineItem(item_id=f"m{i}", kind=ItemKind.ASSISTANT, created_ms=1, text="x")
        for i in range(MAX_CACHED_ITEMS + 1)
    ]
    await store.upsert_items("t", items, now_ms=1)
    assert len(await store.history("t")) == MAX_CACHED_ITEMS + 1
    await store.upsert_items("t", [items[0]], now_ms=2)
    extra = TimelineItem(item_id="last", kind=ItemKind.ASSISTANT, created_ms=1, text="y")
    await store.upsert_items("t", [extra], now_ms=3)
    history = await store.history("t")
    assert history == await _fresh(store_path, "t")
    assert history[-1].item_id == "last"


async def test_many_tasks_read_in_turn_stay_exact(store: SqliteTaskStore, store_path: Path) -> None:
    # More tasks than the cache keeps, read and written in turn: evicted ones are read again.
    ids = [f"t{i}" for i in range(MAX_CACHED_TASKS + 3)]
    for task_id in ids:
        await store.create_task(task_record(id=task_id))
        assert await store.history(task_id) == []
    for round_ in range(2):
        for task_id in ids:
            item = TimelineItem(
                item_id=f"m{round_}", kind=ItemKind.ASSISTANT, created_ms=1, text=task_id
            )
            await store.upsert_items(task_id, [item], now_ms=round_)
            assert len(await store.history(task_id)) == round_ + 1
    for task_id in ids[:3] + ids[-3:]:
        assert await store.history(task_id) == await _fresh(store_path, task_id)
