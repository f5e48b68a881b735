"""List-page latency of the SQLite task store over 100k tasks (target: <= 20 ms per page).

Builds a store file with ``--tasks`` rows spread over a few accounts and project roots (most
caller-mediated, some auto, a few provisional and archived, many ties on ``updated_ms``),
then times ``SqliteTaskStore.list_tasks`` — the public call, worker-thread hop included —
for the first page and for a deep page (reached by following cursors) of several queries,
and prints each query's ``EXPLAIN QUERY PLAN`` so index use is visible.

The rows are written with one ``executemany`` in one transaction straight into the file
(after ``SqliteTaskStore.open`` created the schema): the point is the read path, and going
through ``create_task`` 100k times would only measure setup.

Usage: python bench/bench_store_list.py [--tasks N] [--repeat N] [--analyze]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import attrs
import trio

from maple_acp.model import ItemKind, TaskPolicy, TaskQuery, TimelineItem
from maple_acp.store import SqliteTaskStore
from maple_acp.store._tasks import list_sql

#: The budget for one page, from the store's requirements.
TARGET_MS = 20.0
ACCOUNTS = ("acct-main", "acct-b", "acct-c", "acct-attic")
#: The main account holds most tasks: the worst case for a page walk.
ACCOUNT_WEIGHTS = (70, 10, 10, 10)
#: An account that archived nearly everything: a default page must skip hidden rows.
ATTIC = "acct-attic"
ROOTS_PER_ACCOUNT = 20
#: How far down the deep page sits (pages of 100 followed from the top).
DEEP_PAGES = 150


def populate(path: Path, count: int, seed: int) -> None:
    rng = random.Random(seed)
    rows = []
    for n in range(count):
        account = rng.choices(ACCOUNTS, ACCOUNT_WEIGHTS)[0]
        root = f"/home/user/projects/p{rng.randrange(ROOTS_PER_ACCOUNT):02d}"
        provisional = rng.random() < 0.02
        archived = rng.random() < (0.98 if account == ATTIC else 0.05)
        policy = "auto" if rng.random() < 0.2 else "caller_mediated"
        surface = "external" if provisional or rng.random() < 0.5 else "desktop"
        updated = 1_700_000_000_000 + rng.randrange(count // 4) * 1_000  # ~4 tasks per tie
        rows.append(
            (
                f"task-{n:07d}",
                account,
                root,
                f"Task {n}",
                0,
                updated - 5_000,
                updated,
                policy,
                surface,
                "model-a",
                int(archived),
                int(provisional),
                None,
            )
        )
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(f"INSERT INTO tasks VALUES ({', '.join('?' * 13)})", rows)
        conn.execute("COMMIT")
    finally:
        conn.close()


def plan(path: Path, query: TaskQuery) -> list[str]:
    sql, params, _ = list_sql(query)
    conn = sqlite3.connect(path)
    try:
        return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
    finally:
        conn.close()


async def time_page(store: SqliteTaskStore, query: TaskQuery, repeat: int) -> tuple[float, int]:
    samples = []
    rows = 0
    for _ in range(repeat):
        start = time.perf_counter()
        page = await store.list_tasks(query)
        samples.append((time.perf_counter() - start) * 1_000)
        rows = len(page.tasks)
    return statistics.median(samples), rows


async def time_upserts(store: SqliteTaskStore, task_id: str, count: int) -> float:
    samples = []
    for n in range(count):
        item = TimelineItem(
            item_id=f"bench-{n}", kind=ItemKind.ASSISTANT, created_ms=n, text="chunk " * 20
        )
        start = time.perf_counter()
        await store.upsert_items(task_id, [item], now_ms=1_800_000_000_000 + n)
        samples.append((time.perf_counter() - start) * 1_000)
    return statistics.median(samples)


async def deep_query(store: SqliteTaskStore, query: TaskQuery) -> tuple[TaskQuery, int]:
    cursor = None
    depth = 0
    for depth in range(DEEP_PAGES):  # noqa: B007
        page = await store.list_tasks(attrs.evolve(query, cursor=cursor))
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    return attrs.evolve(query, cursor=cursor), depth


async def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.sqlite3"
        await (await SqliteTaskStore.open(path)).aclose()
        start = time.perf_counter()
        populate(path, args.tasks, seed=7)
        setup_s = time.perf_counter() - start
        if args.analyze:
            conn = sqlite3.connect(path)
            conn.execute("ANALYZE")
            conn.close()
        sys.stdout.write(
            f"{args.tasks} tasks written in {setup_s:.1f} s; "
            f"statistics: {'ANALYZE' if args.analyze else 'none'}\n"
        )
        queries = {
            "account": TaskQuery(account=ACCOUNTS[0]),
            "account+root": TaskQuery(account=ACCOUNTS[0], root="/home/user/projects/p03"),
            "account+policy": TaskQuery(account=ACCOUNTS[0], policy=TaskPolicy.CALLER_MEDIATED),
            "account+root+policy": TaskQuery(
                account=ACCOUNTS[0],
                root="/home/user/projects/p03",
                policy=TaskPolicy.CALLER_MEDIATED,
            ),
            "account+archived": TaskQuery(account=ACCOUNTS[0], include_archived=True),
            "98%-archived account": TaskQuery(account=ATTIC),
        }
        worst = 0.0
        async with await SqliteTaskStore.open(path) as store:
            for name, query in queries.items():
                first_ms, first_rows = await time_page(store, query, args.repeat)
                deep, depth = await deep_query(store, query)
                deep_ms, deep_rows = await time_page(store, deep, args.repeat)
                worst = max(worst, first_ms, deep_ms)
                sys.stdout.write(
                    f"{name:>22}: first page {first_ms:6.2f} ms ({first_rows} rows), "
                    f"page {depth + 1} {deep_ms:6.2f} ms ({deep_rows} rows)\n"
                )
                for line in plan(path, deep):
                    sys.stdout.write(f"{'':>24}plan: {line}\n")
            # The write every streamed row pays: one item plus the task's updated_ms, which
            # moves the task in each list index.
            upsert_ms = await time_upserts(store, "task-0000000", args.repeat * 10)
            sys.stdout.write(
                f"upsert_items of one row (task row re-keyed in the list indexes): "
                f"{upsert_ms:.3f} ms median\n"
            )
        verdict = "within" if worst <= TARGET_MS else "OVER"
        sys.stdout.write(
            f"worst median page: {worst:.2f} ms ({verdict} the {TARGET_MS:.0f} ms target; "
            f"{worst / TARGET_MS:.2f} of the budget)\n"
        )
        return 0 if worst <= TARGET_MS else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--analyze", action="store_true", help="run ANALYZE before timing")
    sys.exit(trio.run(main, parser.parse_args()))
