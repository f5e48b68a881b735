"""Sweeping provisional tasks: expired grace, running grace, stranded rows, touched rows."""

from __future__ import annotations

from maple_acp.model import ItemKind, TaskRecord, TaskSurface, TimelineItem
from maple_acp.store import SqliteTaskStore
from maple_acp.testing.store import task_record

NOW = 100_000


async def populate(store: SqliteTaskStore) -> None:
    def external(task_id: str, **fields: object) -> None:
        tasks.append(
            task_record(id=task_id, surface=TaskSurface.EXTERNAL, provisional=True, **fields)
        )

    tasks: list[TaskRecord] = []
    external("expired", provisional_expires_ms=NOW - 1)
    external("expires-now", provisional_expires_ms=NOW)
    external("grace-running", provisional_expires_ms=NOW + 1)
    external("stranded")
    external("renamed-expired", provisional_expires_ms=NOW - 1, title="x", user_renamed=True)
    external("renamed-stranded", title="x", user_renamed=True)
    external("with-item-expired", provisional_expires_ms=NOW - 1)
    external("with-item-stranded")
    tasks.append(task_record(id="durable"))
    tasks.append(task_record(id="durable-external", surface=TaskSurface.EXTERNAL))
    # A desktop task is never provisional in practice; if one were, sweeping is not its rule.
    tasks.append(task_record(id="desktop-provisional", provisional=True, provisional_expires_ms=1))
    for task in tasks:
        await store.create_task(task)
    for task_id in ("with-item-expired", "with-item-stranded"):
        await store.upsert_items(
            task_id,
            [TimelineItem(item_id="a", kind=ItemKind.ASSISTANT, created_ms=1, text="x")],
            now_ms=1_000,
        )


ALL = {
    "expired",
    "expires-now",
    "grace-running",
    "stranded",
    "renamed-expired",
    "renamed-stranded",
    "with-item-expired",
    "with-item-stranded",
    "durable",
    "durable-external",
    "desktop-provisional",
}


async def remaining(store: SqliteTaskStore) -> set[str]:
    return {task_id for task_id in ALL if await store.get_task(task_id) is not None}


async def test_periodic_sweep_deletes_only_expired_untouched_tasks(
    store: SqliteTaskStore,
) -> None:
    await populate(store)
    assert await store.sweep_provisional(now_ms=NOW, stranded=False) == [
        "expired",
        "expires-now",
    ]
    assert await remaining(store) == ALL - {"expired", "expires-now"}
    assert await store.sweep_provisional(now_ms=NOW, stranded=False) == []


async def test_startup_sweep_also_deletes_stranded_tasks(store: SqliteTaskStore) -> None:
    await populate(store)
    deleted = await store.sweep_provisional(now_ms=NOW, stranded=True)
    assert deleted == ["expired", "expires-now", "stranded"]
    assert await remaining(store) == ALL - set(deleted)


async def test_a_running_grace_ends_with_time(store: SqliteTaskStore) -> None:
    await populate(store)
    await store.sweep_provisional(now_ms=NOW, stranded=False)
    assert await store.sweep_provisional(now_ms=NOW + 1, stranded=False) == ["grace-running"]


async def test_a_task_admitted_during_grace_is_never_swept(store: SqliteTaskStore) -> None:
    await store.create_task(
        task_record(
            id="p", surface=TaskSurface.EXTERNAL, provisional=True, provisional_expires_ms=5
        )
    )
    await store.admit_user_message(
        "p", TimelineItem(item_id="m", kind=ItemKind.USER, created_ms=1, text="hi"), now_ms=2
    )
    assert await store.sweep_provisional(now_ms=NOW, stranded=True) == []
    assert await store.get_task("p") is not None
