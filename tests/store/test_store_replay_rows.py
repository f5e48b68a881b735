"""``replay_rows``: a history as a replay reads it. Message rows may come as ``MessageRow``
values (kind, item id, text), every other row whole; read from the file or from the store's
cache, it must say exactly what ``history`` says."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from maple_acp.model import (
    MESSAGE_KINDS,
    ItemKind,
    MessageRow,
    PlanEntry,
    TimelineItem,
    ToolState,
    ToolStatus,
)
from maple_acp.store import SqliteTaskStore, StoreError
from maple_acp.testing.store import task_record


def _as_item(row: TimelineItem | MessageRow, like: TimelineItem) -> TimelineItem:
    """A replay row read back as the item it stands for (a message row keeps kind, id and
    text)."""
    if isinstance(row, MessageRow):
        assert type(row.kind) is ItemKind
        assert row.kind in MESSAGE_KINDS
        assert row == (like.kind, like.item_id, like.text)
        assert like.tool is None
        assert like.plan == ()
        return like
    return row


def _history(rng: random.Random, size: int) -> list[TimelineItem]:
    items: list[TimelineItem] = []
    for index in range(size):
        choice = rng.randrange(8)
        common = {"item_id": f"i{index}", "created_ms": index, "run_id": f"r{index % 3}"}
        if choice < 4:
            kind = rng.choice(MESSAGE_KINDS)
            text = rng.choice(["", "hello", 'line\nbreak "quoted" \\ \x00', "é" * 20])
            items.append(TimelineItem(kind=kind, text=text, **common))
        elif choice == 4:
            tool = ToolState(name="shell", status=ToolStatus.COMPLETED, output_text="out")
            items.append(TimelineItem(kind=ItemKind.TOOL, text="ran", tool=tool, **common))
        elif choice == 5:
            # A tool row that never carried a tool state, and a plan row without entries.
            items.append(TimelineItem(kind=ItemKind.TOOL, text="bare", **common))
        elif choice == 6:
            items.append(
                TimelineItem(kind=ItemKind.PLAN, plan=(PlanEntry(content="step"),), **common)
            )
        else:
            items.append(TimelineItem(kind=ItemKind.PLAN, **common))
    return items


@pytest.mark.parametrize("seed", range(6))
async def test_replay_rows_say_what_history_says(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "tasks.sqlite3"
    async with await SqliteTaskStore.open(path) as store:
        await store.create_task(task_record(id="t"))
        await store.upsert_items("t", _history(rng, rng.randrange(1, 60)), now_ms=1)
    # A fresh store: nothing cached, the rows come from the file.
    async with await SqliteTaskStore.open(path) as store:
        cold = await store.replay_rows("t")
        history = await store.history("t")
        assert [_as_item(row, item) for row, item in zip(cold, history, strict=True)] == history
        # Message rows read from the file are MessageRow values; everything else is whole.
        assert [isinstance(row, MessageRow) for row in cold] == [
            item.kind in MESSAGE_KINDS for item in history
        ]
        # history() filled the cache: the replay now hands out the cached items themselves.
        assert await store.replay_rows("t") == history


async def test_unknown_task_replays_nothing(store: SqliteTaskStore) -> None:
    assert await store.replay_rows("nope") == []


async def test_a_row_of_an_unknown_kind_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite3"
    async with await SqliteTaskStore.open(path) as store:
        for task in ("t", "ok"):
            await store.create_task(task_record(id=task))
            item = TimelineItem(item_id="m", kind=ItemKind.ASSISTANT, created_ms=1, text="hi")
            await store.upsert_items(task, [item], now_ms=1)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("UPDATE items SET kind = 'hologram' WHERE task_id = 't'")
    finally:
        conn.close()
    async with await SqliteTaskStore.open(path) as store:
        with pytest.raises(StoreError, match="does not know"):
            await store.replay_rows("t")
        # The store stays usable for the task next door.
        assert await store.replay_rows("ok") == [MessageRow(ItemKind.ASSISTANT, "m", "hi")]
