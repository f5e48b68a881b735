"""A fork copies a task's history into a new task in one transaction: all of it, or up to
and including a message; an unknown source or message writes nothing; the source is
untouched."""

from __future__ import annotations

import pytest

from maple_acp.model import ItemKind, TaskQuery, TaskSurface, TimelineItem, ToolState, ToolStatus
from maple_acp.store import ForkSourceMissing, SqliteTaskStore
from maple_acp.testing.store import task_record


async def fill(store: SqliteTaskStore) -> list[TimelineItem]:
    await store.create_task(task_record(id="src", root="/project"))
    await store.admit_user_message(
        "src",
        TimelineItem(item_id="u1", kind=ItemKind.USER, created_ms=1, run_id="r1", text="one"),
        now_ms=1_000,
    )
    await store.upsert_items(
        "src",
        [
            TimelineItem(
                item_id="a1", kind=ItemKind.ASSISTANT, created_ms=2, run_id="r1", text="x"
            ),
            TimelineItem(
                item_id="t1",
                kind=ItemKind.TOOL,
                created_ms=3,
                run_id="r1",
                tool=ToolState(name="shell", status=ToolStatus.COMPLETED, raw_input={"c": 1}),
            ),
        ],
        now_ms=2_000,
    )
    await store.admit_user_message(
        "src",
        TimelineItem(item_id="u2", kind=ItemKind.USER, created_ms=4, run_id="r2", text="two"),
        now_ms=3_000,
    )
    await store.upsert_items(
        "src",
        [TimelineItem(item_id="a2", kind=ItemKind.ASSISTANT, created_ms=5, run_id="r2", text="y")],
        now_ms=4_000,
    )
    return await store.history("src")


async def test_a_fork_copies_the_whole_history_and_leaves_the_source_alone(
    store: SqliteTaskStore,
) -> None:
    before = await fill(store)
    source = await store.get_task("src")
    fork = task_record(id="fork", root="/project", provisional=True)
    assert await store.fork_task("src", fork, up_to=None) == 5
    assert await store.history("fork") == before
    assert await store.history("src") == before
    assert await store.get_task("src") == source
    # Provisional until prompted, however much history it carries.
    stored = await store.get_task("fork")
    assert stored is not None
    assert stored.provisional
    listed = await store.list_tasks(TaskQuery(account=fork.account))
    assert [task.id for task in listed.tasks] == ["src"]


async def test_a_fork_up_to_a_message_keeps_that_message_and_what_came_before(
    store: SqliteTaskStore,
) -> None:
    before = await fill(store)
    assert await store.fork_task("src", task_record(id="f1", root="/project"), up_to="a1") == 2
    assert [item.item_id for item in await store.history("f1")] == ["u1", "a1"]
    await store.fork_task("src", task_record(id="f2", root="/project"), up_to="u2")
    assert await store.history("f2") == before[:4]
    # The copy is a task of its own: writing to it never shows in the source.
    await store.upsert_items(
        "f1",
        [TimelineItem(item_id="n", kind=ItemKind.ASSISTANT, created_ms=9, run_id="r9", text="z")],
        now_ms=9_000,
    )
    assert await store.history("src") == before


@pytest.mark.parametrize(
    ("source", "up_to", "message"), [("nope", None, False), ("src", "zz", True)]
)
async def test_an_unknown_source_or_message_writes_nothing(
    store: SqliteTaskStore, source: str, up_to: str | None, message: bool
) -> None:
    await fill(store)
    with pytest.raises(ForkSourceMissing) as caught:
        await store.fork_task(source, task_record(id="fork", root="/project"), up_to=up_to)
    assert caught.value.message is message
    assert await store.get_task("fork") is None
    assert await store.history("fork") == []


async def test_an_unprompted_fork_is_swept_like_any_provisional_task(
    store: SqliteTaskStore,
) -> None:
    await fill(store)
    fork = task_record(id="fork", root="/project", provisional=True, surface=TaskSurface.EXTERNAL)
    await store.fork_task("src", fork, up_to=None)
    # Its copied rows are not its own: closing its lease deletes it, as the sweep does.
    assert await store.delete_task_if_unchanged(fork)
    await store.fork_task("src", fork, up_to=None)
    await store.set_provisional_expiry("fork", 5_000)
    assert await store.sweep_provisional(now_ms=5_000, stranded=False) == ["fork"]
    assert await store.history("fork") == []
    assert len(await store.history("src")) == 5


async def test_a_fork_with_a_row_of_its_own_is_kept(store: SqliteTaskStore) -> None:
    await fill(store)
    fork = task_record(id="fork", root="/project", provisional=True, surface=TaskSurface.EXTERNAL)
    await store.fork_task("src", fork, up_to="a1")
    await store.upsert_items(
        "fork",
        [TimelineItem(item_id="n", kind=ItemKind.ASSISTANT, created_ms=9, run_id="r9", text="z")],
        now_ms=9_000,
    )
    await store.set_provisional_expiry("fork", 5_000)
    assert await store.sweep_provisional(now_ms=10_000, stranded=True) == []
    assert len(await store.history("fork")) == 3
