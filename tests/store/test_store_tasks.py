"""Task rows: create, read, the single-field changes, deletion and provisional deletion."""

from __future__ import annotations

import attrs
import pytest

from maple_acp.model import (
    GoalRecord,
    GoalStatus,
    ItemKind,
    TaskPolicy,
    TaskRecord,
    TaskSurface,
    TimelineItem,
    Usage,
)
from maple_acp.store import SqliteTaskStore, StoreError
from maple_acp.testing.store import task_record


def provisional(**fields: object) -> TaskRecord:
    return task_record(surface=TaskSurface.EXTERNAL, provisional=True, **fields)


async def test_create_then_get_returns_the_same_record(store: SqliteTaskStore) -> None:
    task = task_record(
        id="t1",
        title="Fix the build",
        user_renamed=True,
        policy=TaskPolicy.AUTO,
        model="model-a",
        archived=True,
        provisional=True,
        provisional_expires_ms=5_000,
        surface=TaskSurface.EXTERNAL,
    )
    await store.create_task(task)
    assert await store.get_task("t1") == task
    assert await store.get_task("missing") is None


async def test_create_with_an_existing_id_fails_and_keeps_the_first(
    store: SqliteTaskStore,
) -> None:
    await store.create_task(task_record(id="t1", title="first"))
    with pytest.raises(StoreError):
        await store.create_task(task_record(id="t1", title="second"))
    stored = await store.get_task("t1")
    assert stored is not None
    assert stored.title == "first"


async def test_rename_sets_title_flag_and_updated(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t1"))
    renamed = await store.rename_task("t1", "New name", user_renamed=True, now_ms=2_000)
    assert renamed == task_record(id="t1", title="New name", user_renamed=True, updated_ms=2_000)
    assert await store.get_task("t1") == renamed
    auto = await store.rename_task("t1", "Auto", user_renamed=False, now_ms=3_000)
    assert auto is not None
    assert (auto.title, auto.user_renamed, auto.updated_ms) == ("Auto", False, 3_000)
    assert await store.rename_task("missing", "x", user_renamed=True, now_ms=1) is None


async def test_set_model_and_clear_it(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t1"))
    changed = await store.set_task_model("t1", "model-b", now_ms=2_000)
    assert changed == task_record(id="t1", model="model-b", updated_ms=2_000)
    cleared = await store.set_task_model("t1", None, now_ms=2_500)
    assert cleared is not None
    assert cleared.model is None
    assert await store.set_task_model("missing", "m", now_ms=1) is None


async def test_provisional_expiry_is_set_and_cleared_without_touching_updated(
    store: SqliteTaskStore,
) -> None:
    await store.create_task(provisional(id="p"))
    started = await store.set_provisional_expiry("p", 9_000)
    assert started == provisional(id="p", provisional_expires_ms=9_000)
    cleared = await store.set_provisional_expiry("p", None)
    assert cleared == provisional(id="p")
    assert await store.set_provisional_expiry("missing", 1) is None


async def test_provisional_expiry_has_no_effect_on_a_durable_task(
    store: SqliteTaskStore,
) -> None:
    await store.create_task(task_record(id="d"))
    assert await store.set_provisional_expiry("d", 9_000) == task_record(id="d")
    assert await store.get_task("d") == task_record(id="d")


async def test_archive_and_unarchive(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t1"))
    archived = await store.set_archived("t1", True, now_ms=2_000)
    assert archived == task_record(id="t1", archived=True, updated_ms=2_000)
    restored = await store.set_archived("t1", False, now_ms=3_000)
    assert restored == task_record(id="t1", updated_ms=3_000)
    assert await store.set_archived("missing", True, now_ms=1) is None


async def test_delete_removes_everything_hanging_off_the_task(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t1"))
    await store.create_task(task_record(id="t2"))
    for task_id in ("t1", "t2"):
        await store.admit_user_message(
            task_id,
            TimelineItem(item_id="m", kind=ItemKind.USER, created_ms=1, text="hi"),
            now_ms=2_000,
        )
        await store.record_usage(task_id, "run", Usage(input_tokens=3))
        await store.put_goal(
            task_id,
            GoalRecord(objective="o", status=GoalStatus.ACTIVE, created_ms=1, updated_ms=1),
        )
    assert await store.delete_task("t1") is True
    assert await store.get_task("t1") is None
    assert await store.history("t1") == []
    assert await store.item_count("t1") == 0
    assert await store.run_usage("t1", "run") is None
    assert await store.get_goal("t1") is None
    assert await store.delete_task("t1") is False
    # The other task is untouched.
    assert await store.item_count("t2") == 1
    assert await store.run_usage("t2", "run") == Usage(input_tokens=3)
    assert await store.get_goal("t2") is not None


async def test_delete_if_unchanged_deletes_an_untouched_provisional_task(
    store: SqliteTaskStore,
) -> None:
    snapshot = provisional(id="p")
    await store.create_task(snapshot)
    assert await store.delete_task_if_unchanged(snapshot) is True
    assert await store.get_task("p") is None
    assert await store.delete_task_if_unchanged(snapshot) is False


_CHANGES: dict[str, object] = {
    "account": "other",
    "root": "/elsewhere",
    "title": "renamed",
    "user_renamed": True,
    "created_ms": 7,
    "updated_ms": 8,
    "policy": TaskPolicy.AUTO,
    "surface": TaskSurface.DESKTOP,
    "model": "model-z",
    "archived": True,
    "provisional_expires_ms": 123,
    "mode": "plan",
    "thought_level": "high",
    "additional_directories": ("/also",),
    "boolean_options": (("brief", True),),
    # The task itself: the only parent the row can name without another row.
    "parent_id": "p",
    "parent_tool_id": "call-1",
}


def test_every_compared_column_has_a_change() -> None:
    compared = {f.name for f in attrs.fields(TaskRecord)} - {"id", "provisional"}
    assert set(_CHANGES) == compared


@pytest.mark.parametrize("field", sorted(_CHANGES))
async def test_delete_if_unchanged_keeps_a_task_with_any_changed_column(
    store: SqliteTaskStore, field: str
) -> None:
    snapshot = provisional(id="p")
    stored = attrs.evolve(snapshot, **{field: _CHANGES[field]})
    await store.create_task(stored)
    assert await store.delete_task_if_unchanged(snapshot) is False
    assert await store.get_task("p") == stored


async def test_delete_if_unchanged_keeps_a_task_changed_through_the_api(
    store: SqliteTaskStore,
) -> None:
    snapshot = provisional(id="p")
    await store.create_task(snapshot)
    await store.set_provisional_expiry("p", 60_000)
    assert await store.delete_task_if_unchanged(snapshot) is False
    await store.set_provisional_expiry("p", None)
    # Back to the snapshot's exact row: deletable again.
    assert await store.delete_task_if_unchanged(snapshot) is True


async def test_delete_if_unchanged_keeps_a_task_with_an_item(store: SqliteTaskStore) -> None:
    snapshot = provisional(id="p")
    await store.create_task(snapshot)
    # upsert_items with an explicit old timestamp leaves every column as in the snapshot;
    # only the item itself makes the difference.
    await store.upsert_items(
        "p",
        [TimelineItem(item_id="a", kind=ItemKind.ASSISTANT, created_ms=1, text="x")],
        now_ms=snapshot.updated_ms,
    )
    assert await store.get_task("p") == snapshot
    assert await store.delete_task_if_unchanged(snapshot) is False
    assert await store.get_task("p") == snapshot


async def test_delete_if_unchanged_keeps_a_task_that_is_no_longer_provisional(
    store: SqliteTaskStore,
) -> None:
    snapshot = provisional(id="p")
    await store.create_task(snapshot)
    await store.admit_user_message(
        "p", TimelineItem(item_id="m", kind=ItemKind.USER, created_ms=1, text="hi"), now_ms=1_000
    )
    assert await store.delete_task_if_unchanged(snapshot) is False
    # A snapshot of a durable task is never a reason to delete.
    durable = task_record(id="d")
    await store.create_task(durable)
    assert await store.delete_task_if_unchanged(durable) is False
    assert await store.get_task("d") == durable


async def test_delete_if_unchanged_keeps_a_row_whose_only_difference_is_provisional(
    store: SqliteTaskStore,
) -> None:
    snapshot = provisional(id="p")
    await store.create_task(attrs.evolve(snapshot, provisional=False))
    assert await store.delete_task_if_unchanged(snapshot) is False
    assert await store.get_task("p") is not None
