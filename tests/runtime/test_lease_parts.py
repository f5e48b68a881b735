"""The plain state the parts of a lease share, on its own: the prompt slot (its claim and the
pulse its waiters wait on) and the task row (one record, and the provisional row following
every write)."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from maple_acp.model import TaskPolicy, TaskRecord, TaskSurface
from maple_acp.runtime import RejectionKind, RuntimeRejection
from maple_acp.runtime._barrier import PromptSlot
from maple_acp.runtime._task_row import TaskRow

TASK = TaskRecord(
    id="t1",
    account="a",
    root="/project",
    created_ms=1,
    updated_ms=1,
    policy=TaskPolicy.CALLER_MEDIATED,
    surface=TaskSurface.EXTERNAL,
    model="m1",
    provisional=True,
)


def fail_while_holding(slot: PromptSlot) -> None:
    with slot.hold() as claim:
        assert slot.claim is claim
        raise RuntimeError("the prompt failed")


async def test_a_slot_holder_that_fails_frees_the_slot_and_wakes_its_waiters() -> None:
    slot = PromptSlot()
    woke = trio.Event()

    async def waiter() -> None:
        await slot.wait()
        woke.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(RuntimeError):
            fail_while_holding(slot)
        await woke.wait()
    assert not slot.held
    assert slot.claim is None


def test_a_write_the_store_found_no_row_for_is_task_not_found_and_changes_nothing() -> None:
    task = TASK
    row = TaskRow(task, created_here=True, history_locked=False)
    with pytest.raises(RuntimeRejection) as caught:
        row.rewritten(None)
    assert caught.value.kind is RejectionKind.TASK_NOT_FOUND
    assert row.record is task


def test_the_first_admitted_message_locks_the_model_and_every_part_sees_it() -> None:
    row = TaskRow(TASK, created_here=True, history_locked=False)
    assert not row.model_locked
    renamed = row.rewritten(attrs.evolve(TASK, model="m2", updated_ms=2))
    assert row.record is renamed
    assert not row.model_locked
    row.admitted(attrs.evolve(TASK, model="m2", provisional=False, updated_ms=3))
    assert row.model_locked
    assert not row.record.provisional
    assert row.provisional.prompted


def test_a_forks_copied_message_locks_the_model_before_any_admission() -> None:
    row = TaskRow(TASK, created_here=True, history_locked=True)
    assert row.model_locked
    assert not row.provisional.prompted
