"""Listing: order, keyset pages with ties, filters, hidden rows, page size and bad cursors."""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path

import attrs
import orjson
import pytest

from maple_acp.model import TaskPolicy, TaskQuery, TaskRecord, TaskSurface
from maple_acp.store import MAX_PAGE, InvalidCursor, SqliteTaskStore
from maple_acp.store._tasks import _encode_cursor, list_sql
from maple_acp.testing.store import task_record


async def collect(store: SqliteTaskStore, query: TaskQuery) -> list[list[str]]:
    """Every page of ``query``, following cursors to the end."""
    pages: list[list[str]] = []
    cursor = None
    while True:
        page = await store.list_tasks(attrs.evolve(query, cursor=cursor))
        pages.append([t.id for t in page.tasks])
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor
        assert len(pages) < 1_000


async def test_newest_first_with_ties_broken_by_id(store: SqliteTaskStore) -> None:
    for task_id, updated in [("a", 5), ("b", 9), ("c", 5), ("d", 1), ("e", 9)]:
        await store.create_task(task_record(id=task_id, updated_ms=updated))
    page = await store.list_tasks(TaskQuery(account="account"))
    assert [t.id for t in page.tasks] == ["e", "b", "c", "a", "d"]
    assert page.next_cursor is None


async def test_pages_with_ties_cover_every_task_once(store: SqliteTaskStore) -> None:
    # 23 tasks sharing a handful of timestamps, so page boundaries fall inside ties.
    expected = []
    for n in range(23):
        task = task_record(id=f"t{n:02d}", updated_ms=1_000 + n // 5)
        await store.create_task(task)
        expected.append(task)
    expected.sort(key=lambda t: (t.updated_ms, t.id), reverse=True)
    pages = await collect(store, TaskQuery(account="account", limit=4))
    assert [len(p) for p in pages] == [4, 4, 4, 4, 4, 3]
    assert [i for p in pages for i in p] == [t.id for t in expected]


async def test_the_last_full_page_has_no_cursor(store: SqliteTaskStore) -> None:
    for n in range(6):
        await store.create_task(task_record(id=f"t{n}", updated_ms=n))
    pages = await collect(store, TaskQuery(account="account", limit=3))
    assert pages == [["t5", "t4", "t3"], ["t2", "t1", "t0"]]


async def test_a_page_never_exceeds_the_maximum(store: SqliteTaskStore) -> None:
    for n in range(MAX_PAGE + 5):
        await store.create_task(task_record(id=f"t{n:03d}", updated_ms=n))
    page = await store.list_tasks(TaskQuery(account="account", limit=10_000))
    assert len(page.tasks) == MAX_PAGE == 100
    assert page.next_cursor is not None
    rest = await store.list_tasks(
        TaskQuery(account="account", limit=10_000, cursor=page.next_cursor)
    )
    assert [t.id for t in rest.tasks] == [f"t{n:03d}" for n in range(4, -1, -1)]
    assert rest.next_cursor is None


@pytest.mark.parametrize("limit", [0, -1])
async def test_a_limit_below_one_is_refused(store: SqliteTaskStore, limit: int) -> None:
    with pytest.raises(ValueError, match="at least one"):
        await store.list_tasks(TaskQuery(account="account", limit=limit))


async def test_an_empty_account_lists_nothing(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="t"))
    page = await store.list_tasks(TaskQuery(account="nobody"))
    assert page.tasks == ()
    assert page.next_cursor is None


def sample() -> list[TaskRecord]:
    rows = []
    n = 0
    for account in ("alice", "bob"):
        for root in ("/p/one", "/p/one/sub", "/p/two"):
            for policy in TaskPolicy:
                for provisional in (False, True):
                    for archived in (False, True):
                        n += 1
                        rows.append(
                            task_record(
                                id=f"t{n:03d}",
                                account=account,
                                root=root,
                                policy=policy,
                                provisional=provisional,
                                archived=archived,
                                surface=TaskSurface.EXTERNAL
                                if provisional
                                else TaskSurface.DESKTOP,
                                updated_ms=(n * 7) % 11,
                            )
                        )
    return rows


def expected_ids(rows: list[TaskRecord], query: TaskQuery) -> list[str]:
    kept = [
        t
        for t in rows
        if t.account == query.account
        and (query.root is None or t.root == query.root)
        and (query.policy is None or t.policy == query.policy)
        and (query.include_provisional or not t.provisional)
        and (query.include_archived or not t.archived)
    ]
    kept.sort(key=lambda t: (t.updated_ms, t.id), reverse=True)
    return [t.id for t in kept]


QUERIES = [
    TaskQuery(account=account, root=root, policy=policy, include_provisional=p, include_archived=a)
    for account in ("alice", "bob")
    for root in (None, "/p/one", "/p/two", "/p")
    for policy in (None, *TaskPolicy)
    for p in (False, True)
    for a in (False, True)
]


async def test_filters_and_hidden_rows_match_a_plain_model(store: SqliteTaskStore) -> None:
    rows = sample()
    for row in rows:
        await store.create_task(row)
    for query in QUERIES:
        for limit in (3, 100):
            pages = await collect(store, attrs.evolve(query, limit=limit))
            assert [i for p in pages for i in p] == expected_ids(rows, query), query


async def test_root_filter_is_exact_not_a_prefix(store: SqliteTaskStore) -> None:
    await store.create_task(task_record(id="a", root="/p/one"))
    await store.create_task(task_record(id="b", root="/p/one/sub"))
    await store.create_task(task_record(id="c", root="/p/on"))
    page = await store.list_tasks(TaskQuery(account="account", root="/p/one"))
    assert [t.id for t in page.tasks] == ["a"]


async def test_a_task_that_moves_between_pages_is_not_listed_twice(
    store: SqliteTaskStore,
) -> None:
    for n in range(6):
        await store.create_task(task_record(id=f"t{n}", updated_ms=100 + n))
    first = await store.list_tasks(TaskQuery(account="account", limit=3))
    assert [t.id for t in first.tasks] == ["t5", "t4", "t3"]
    # A listed task gets newer while the caller pages: keyset paging continues below the
    # cursor, so it is neither repeated nor does it push another task out.
    await store.rename_task("t5", "new", user_renamed=True, now_ms=999)
    second = await store.list_tasks(TaskQuery(account="account", limit=3, cursor=first.next_cursor))
    assert [t.id for t in second.tasks] == ["t2", "t1", "t0"]


def forge(payload: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(payload)).decode().rstrip("=")


async def test_bad_cursors_are_refused_and_the_store_stays_usable(
    store: SqliteTaskStore,
) -> None:
    for n in range(5):
        await store.create_task(task_record(id=f"t{n}", updated_ms=n, root=f"/r{n % 2}"))
    query = TaskQuery(account="account", limit=2)
    good = (await store.list_tasks(query)).next_cursor
    assert good is not None
    other = (await store.list_tasks(attrs.evolve(query, root="/r0", limit=1))).next_cursor
    assert other is not None
    decoded = orjson.loads(base64.urlsafe_b64decode(good + "=" * (-len(good) % 4)))
    bad = [
        "",
        "garbage!!",
        "not base64 at all \x00",
        good[: len(good) // 2],  # truncated
        good[:-1],
        good + "A",
        good + "====",
        "A" * 10_000,
        other,  # from another query
        forge([1, 2, 3]),
        forge("string"),
        forge({"u": 1, "i": "t1"}),
        forge({**decoded, "extra": 1}),
        forge({**decoded, "u": "1"}),
        forge({**decoded, "u": True}),
        forge({**decoded, "u": 1.5}),
        forge({**decoded, "i": 7}),
        forge({**decoded, "q": "0" * 32}),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ]
    for cursor in bad:
        with pytest.raises(InvalidCursor):
            await store.list_tasks(attrs.evolve(query, cursor=cursor))
    # A cursor from another account or another filter is refused as well.
    for changed in (
        {"account": "someone"},
        {"include_archived": True},
        {"include_provisional": True},
        {"policy": TaskPolicy.AUTO},
        {"root": "/r1"},
    ):
        with pytest.raises(InvalidCursor):
            await store.list_tasks(attrs.evolve(query, cursor=good, **changed))
    # The page size is not part of the query's identity.
    page = await store.list_tasks(attrs.evolve(query, cursor=good, limit=50))
    assert [t.id for t in page.tasks] == ["t2", "t1", "t0"]


@pytest.mark.parametrize("query", QUERIES[:: len(QUERIES) // 16 or 1])
async def test_every_list_query_walks_an_index_without_sorting(
    store: SqliteTaskStore, store_path: Path, query: TaskQuery
) -> None:
    # Timing belongs to bench/bench_store_list.py; here only the shape of the plan: a page
    # must never sort or scan the whole table, whatever the filters and the cursor.
    await store.create_task(task_record(id="t"))
    for cursor in (None, _encode_cursor(query, task_record(id="t"))):
        sql, params, _ = list_sql(attrs.evolve(query, cursor=cursor))
        conn = sqlite3.connect(store_path)
        try:
            steps = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
        finally:
            conn.close()
        assert len(steps) == 1, steps
        assert steps[0].startswith("SEARCH tasks USING INDEX tasks_"), steps
        if cursor is not None:
            assert "(updated_ms,id)<(?,?)" in steps[0], steps
