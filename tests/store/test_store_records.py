"""Per-run usage, project trust and goals."""

from __future__ import annotations

import pytest

from maple_acp.model import GoalRecord, GoalStatus, Usage
from maple_acp.store import SqliteTaskStore, StoreError
from maple_acp.testing.store import task_record


async def test_usage_is_kept_per_run_not_accumulated(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    first = Usage(
        input_tokens=10,
        output_tokens=20,
        total_tokens=30,
        cache_read_tokens=4,
        cache_write_tokens=5,
    )
    second = Usage(input_tokens=1, output_tokens=2, total_tokens=3)
    await store.record_usage("t", "run-1", first)
    await store.record_usage("t", "run-2", second)
    assert await store.run_usage("t", "run-1") == first
    assert await store.run_usage("t", "run-2") == second
    # A later record for the same run replaces it.
    await store.record_usage("t", "run-1", second)
    assert await store.run_usage("t", "run-1") == second
    assert await store.run_usage("t", "run-3") is None
    assert await store.run_usage("other", "run-1") is None


async def test_usage_for_a_missing_task_is_refused(store: SqliteTaskStore) -> None:
    with pytest.raises(StoreError):
        await store.record_usage("missing", "run", Usage(input_tokens=1))
    assert await store.run_usage("missing", "run") is None


async def test_trust_set_change_and_forget(store: SqliteTaskStore) -> None:
    assert await store.get_trust("alice", "/p") is None
    await store.set_trust("alice", "/p", True, now_ms=1)
    assert await store.get_trust("alice", "/p") is True
    # Scoped per account and per exact directory.
    assert await store.get_trust("bob", "/p") is None
    assert await store.get_trust("alice", "/p/sub") is None
    await store.set_trust("alice", "/p", False, now_ms=2)
    assert await store.get_trust("alice", "/p") is False
    await store.set_trust("alice", "/p", None, now_ms=3)
    assert await store.get_trust("alice", "/p") is None
    # Forgetting an undecided directory is harmless.
    await store.set_trust("alice", "/never", None, now_ms=4)
    assert await store.get_trust("alice", "/never") is None


async def test_goal_put_replace_and_clear(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    assert await store.get_goal("t") is None
    goal = GoalRecord(
        objective="Ship the release",
        status=GoalStatus.ACTIVE,
        created_ms=10,
        updated_ms=10,
        token_budget=5_000,
    )
    await store.put_goal("t", goal)
    assert await store.get_goal("t") == goal
    later = GoalRecord(
        objective="Ship the release",
        status=GoalStatus.BLOCKED,
        iterations=3,
        last_reason="tests fail",
        created_ms=10,
        updated_ms=99,
        token_budget=5_000,
        tokens_used=1_234,
    )
    await store.put_goal("t", later)
    assert await store.get_goal("t") == later
    await store.put_goal("t", None)
    assert await store.get_goal("t") is None
    await store.put_goal("t", None)


@pytest.mark.parametrize("status", list(GoalStatus))
async def test_every_goal_status_round_trips(store: SqliteTaskStore, status: GoalStatus) -> None:
    await store.create_task(task_record(id="t"))
    goal = GoalRecord(objective="o", status=status, created_ms=1, updated_ms=2)
    await store.put_goal("t", goal)
    assert await store.get_goal("t") == goal


async def test_goal_for_a_missing_task_is_refused(store: SqliteTaskStore) -> None:
    goal = GoalRecord(objective="o", status=GoalStatus.ACTIVE, created_ms=1, updated_ms=1)
    with pytest.raises(StoreError):
        await store.put_goal("missing", goal)
    assert await store.get_goal("missing") is None
