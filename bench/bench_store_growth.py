"""Does a run-end history write cost more on a big store than on an empty one?

Builds, once, two store files in a temporary directory that each already hold ``--items``
history items (200,000 by default, over 100 MB): one spread over many tasks, one in a single
task. Then, in the same run and in rotating order, times the write a long run makes when it
ends, one ``SqliteTaskStore.upsert_items`` call with ``--write`` new items (10,000 by default:
assistant text, thoughts and tool rows with ids in random order, as a backend may choose
them), on: a fresh empty store (new task), the many-task store (new task), and the
single-task store (into its big task), and a store of such runs each after a 1 MB prompt (a
pasted log: a row far longer than a page, right before the write; it starts empty and keeps
every earlier repetition's task). Prints wall and CPU medians and the ratios
big/empty (target: at most 1.5x), plus the query plan of every statement the write runs.

The big stores are written with ``executemany`` in one transaction straight into the file
(after ``SqliteTaskStore.open`` created the schema): going through the store item by item
would only measure setup.

Usage: python bench/bench_store_growth.py [--items N] [--write N] [--repeat N] [--per-task N]
       [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import trio

from maple_acp.model import (
    ItemKind,
    TaskRecord,
    TaskSurface,
    TimelineItem,
    ToolLocation,
    ToolState,
    ToolStatus,
)
from maple_acp.store import SqliteTaskStore
from maple_acp.store._history import _ITEM_COLUMNS, WRITE_STATEMENTS, encode_items

#: The budget: a write on the big store costs at most this many times the same write on an
#: empty store.
TARGET_RATIO = 1.5
#: Rows per ``executemany`` while building (all in one transaction).
BUILD_BATCH = 20_000
#: Items per run in the big stores (each run has its own run id).
RUN_ITEMS = 400
#: A pasted log as a prompt: a row far longer than a page, right before the write.
LONG_PROMPT_CHARS = 1_000_000
ACCOUNT = "account"
WORDS = [
    "store",
    "index",
    "page",
    "write",
    "cost",
    "grows",
    "with",
    "file",
    "size",
    "because",
    "each",
    "insert",
    "walks",
    "a",
    "tree",
    "whose",
    "pages",
    "are",
    "no",
    "longer",
    "cached",
    "so",
    "it",
    "reads",
    "them",
    "again",
    "while",
    "the",
    "run",
    "waits",
]


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def run_items(rng: random.Random, run_id: str, count: int) -> list[TimelineItem]:
    """The items a long run leaves behind: the prompt (2-20 KB), then mostly text, every fifth
    a tool call, every fiftieth a long answer (4-16 KB, a page of code)."""
    items = []
    for n in range(count):
        item_id = uuid.uuid4().hex
        if n == 0 or n % 50 == 49:
            items.append(
                TimelineItem(
                    item_id=item_id,
                    kind=ItemKind.USER if n == 0 else ItemKind.ASSISTANT,
                    created_ms=n,
                    run_id=run_id,
                    text=sentence(rng, rng.randrange(400, 3000) if n == 0 else 1500),
                )
            )
        elif n % 5 == 4:
            path = f"/home/user/project/src/module_{rng.randrange(500)}.py"
            tool = ToolState(
                name="shell",
                status=ToolStatus.COMPLETED,
                title="run the tests",
                raw_input={"command": f"pytest -q {path}"},
                raw_output={"exit": 0, "lines": [sentence(rng, 8) for _ in range(3)]},
                output_text=sentence(rng, 30),
                locations=(ToolLocation(path=path, line=rng.randrange(1, 400)),),
            )
            items.append(
                TimelineItem(
                    item_id=item_id,
                    kind=ItemKind.TOOL,
                    created_ms=n,
                    run_id=run_id,
                    text="run the tests",
                    tool=tool,
                )
            )
        else:
            kind = ItemKind.THOUGHT if n % 5 == 3 else ItemKind.ASSISTANT
            items.append(
                TimelineItem(
                    item_id=item_id,
                    kind=kind,
                    created_ms=n,
                    run_id=run_id,
                    text=sentence(rng, rng.randrange(40, 90)),
                )
            )
    return items


def task(task_id: str, now_ms: int) -> TaskRecord:
    return TaskRecord(
        id=task_id,
        account=ACCOUNT,
        root="/home/user/project",
        title="",
        created_ms=now_ms,
        updated_ms=now_ms,
        surface=TaskSurface.DESKTOP,
    )


async def create_schema(path: Path) -> None:
    store = await SqliteTaskStore.open(path)
    await store.aclose()


def populate(path: Path, items: int, per_task: int, seed: int) -> None:
    """Write ``items`` history items over ``items / per_task`` tasks, raw and fast. Each task
    holds runs of ``RUN_ITEMS`` items, each run with its own id, as the runtime writes them."""
    rng = random.Random(seed)
    conn = sqlite3.connect(path, isolation_level=None)
    insert = (
        f"INSERT INTO items (task_id, {', '.join(_ITEM_COLUMNS)}) "
        f"VALUES ({', '.join('?' * (len(_ITEM_COLUMNS) + 1))})"
    )
    # One template run, re-keyed per run: encoding 200k items anew would only measure setup.
    template = encode_items(run_items(rng, "run", RUN_ITEMS))
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("BEGIN")
        rows: list[tuple[object, ...]] = []
        for t in range(max(1, items // per_task)):
            task_id = uuid.uuid4().hex
            conn.execute(
                "INSERT INTO tasks VALUES (?, ?, ?, '', 0, ?, ?, 'caller_mediated', "
                "'desktop', NULL, 0, 0, NULL)",
                (task_id, ACCOUNT, f"/home/user/p{t % 50}", t, t),
            )
            for seq in range(1, per_task + 1):
                if seq % RUN_ITEMS == 1:
                    run_id = uuid.uuid4().hex
                params = template[(seq - 1) % RUN_ITEMS]
                # Backends choose item ids (a provider's tool call ids, say): random order.
                rows.append((task_id, seq, uuid.uuid4().hex, params[1], run_id, *params[3:]))
            if len(rows) >= BUILD_BATCH:
                conn.executemany(insert, rows)
                rows.clear()
        conn.executemany(insert, rows)
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def largest_task(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "SELECT task_id FROM items GROUP BY task_id ORDER BY COUNT(*) DESC LIMIT 1"
        ).fetchone()
        return str(row[0])
    finally:
        conn.close()


def show_plans(path: Path) -> None:
    """The query plan of every statement a history write runs, with placeholders bound."""
    conn = sqlite3.connect(path)
    try:
        for sql in WRITE_STATEMENTS:
            nargs = sql.count("?")
            plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", (None,) * nargs)]
            shown = " / ".join(plan) or "(no search: a plain insert)"
            print(f"  {' '.join(sql.split())[:70]}...\n      -> {shown}")
    finally:
        conn.close()


async def write_once(
    store: SqliteTaskStore,
    task_id: str | None,
    items: list[TimelineItem],
    now_ms: int,
    prompt_chars: int = 0,
) -> tuple[float, float]:
    """Wall and process CPU seconds of one run-end write (into a new task if ``task_id`` is
    None, which first gets a prompt of ``prompt_chars`` if that is not 0)."""
    if task_id is None:
        task_id = uuid.uuid4().hex
        await store.create_task(task(task_id, now_ms))
        if prompt_chars:
            prompt = TimelineItem(
                item_id=uuid.uuid4().hex,
                kind=ItemKind.USER,
                created_ms=now_ms,
                run_id=items[0].run_id,
                text="p" * prompt_chars,
            )
            await store.admit_user_message(task_id, prompt, now_ms=now_ms)
    wall, cpu = time.perf_counter(), time.process_time()
    await store.upsert_items(task_id, items, now_ms=now_ms)
    return time.perf_counter() - wall, time.process_time() - cpu


def report(name: str, times: list[tuple[float, float]]) -> tuple[float, float]:
    wall = statistics.median(t[0] for t in times) * 1e3
    cpu = statistics.median(t[1] for t in times) * 1e3
    each = ", ".join(f"{t[0] * 1e3:.0f}" for t in times)
    print(f"  {name:<34} wall {wall:7.1f} ms  cpu {cpu:7.1f} ms   ({each})")
    return wall, cpu


async def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-store-growth-", dir=args.keep) as tmp:
        many = Path(tmp) / "many-tasks.sqlite3"
        one = Path(tmp) / "one-task.sqlite3"
        for path, per_task in ((many, args.per_task), (one, args.items)):
            await create_schema(path)
            start = time.perf_counter()
            populate(path, args.items, per_task, args.seed)
            print(
                f"built {path.name}: {args.items:,} items in tasks of {per_task:,}, "
                f"{os.path.getsize(path) / 1e6:.0f} MB, in {time.perf_counter() - start:.1f} s"
            )
        show_plans(many)
        big_task = largest_task(one)
        rng = random.Random(args.seed + 1)
        runs: dict[str, list[tuple[float, float]]] = {
            "empty": [],
            "many": [],
            "one": [],
            "long": [],
        }
        stores = {
            "many": await SqliteTaskStore.open(many),
            "one": await SqliteTaskStore.open(one),
            # Starts empty and keeps every task the "long" writes make (a prompt, a run).
            "long": await SqliteTaskStore.open(Path(tmp) / "long-prompts.sqlite3"),
        }
        try:
            for rep in range(args.repeat):
                run_id = uuid.uuid4().hex
                items = run_items(rng, run_id, args.write)
                # A fresh empty file each time, so "empty" stays empty.
                empty = await SqliteTaskStore.open(Path(tmp) / f"empty-{rep}.sqlite3")
                order = [
                    ("empty", empty, None, 0),
                    ("many", stores["many"], None, 0),
                    ("one", stores["one"], big_task, 0),
                    ("long", stores["long"], None, LONG_PROMPT_CHARS),
                ]
                # Rotate which store goes first, so none always meets the others' leftovers.
                order = order[rep % 4 :] + order[: rep % 4]
                try:
                    for name, store, task_id, prompt in order:
                        took = await write_once(store, task_id, items, 10_000 + rep, prompt)
                        runs[name].append(took)
                finally:
                    await empty.aclose()
        finally:
            for store in stores.values():
                await store.aclose()
        print(f"{args.write:,}-item run-end write, median of {args.repeat}:")
        empty_wall, _ = report("empty store, new task", runs["empty"])
        many_wall, _ = report(f"{args.items:,} items, new task", runs["many"])
        one_wall, _ = report(f"{args.items:,} items, into that task", runs["one"])
        long_wall, _ = report("after a 1 MB prompt, new task", runs["long"])
        worst = 1.0
        for label, wall in (
            ("new task", many_wall),
            ("into the big task", one_wall),
            ("after a 1 MB prompt", long_wall),
        ):
            ratio = wall / empty_wall
            worst = max(worst, ratio)
            verdict = "ok" if ratio <= TARGET_RATIO else "OVER TARGET"
            print(f"  ratio big/empty, {label}: {ratio:.2f}x (target <= {TARGET_RATIO}x) {verdict}")
        return 0 if worst <= TARGET_RATIO else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--write", type=int, default=10_000)
    parser.add_argument(
        "--per-task", type=int, default=2_000, help="items per task in the many-task store"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", default=None, help="directory for the temporary store files")
    sys.exit(trio.run(main, parser.parse_args()))
