"""What a delete costs now that it checkpoints the WAL (TRUNCATE) before it returns.

Builds a store of ``--tasks`` tasks (each a user message and a few assistant rows of about a
kilobyte, through the public API), copies the closed file twice, and times
``SqliteTaskStore.delete_task`` — worker-thread hop included — on each copy: once as shipped
(commit, then ``PRAGMA wal_checkpoint(TRUNCATE)``) and once with the checkpoint switched off
(the commit alone, as before). A checkpoint's cost grows with the WAL it copies, so each
delete follows ``--writes`` ordinary writes (a running session's rows) made since the last one;
``--writes 0`` times deletes back to back.

Usage: python bench/bench_store_delete.py [--tasks N] [--deletes N] [--writes N]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from maple_acp.model import ItemKind, TimelineItem
from maple_acp.store import SqliteTaskStore, _sqlite
from maple_acp.testing.store import STORE_FILE_NAME, task_record

ROWS_PER_TASK = 6
ROW_TEXT = "lorem ipsum dolor sit amet " * 40  # ~1 KiB


def rows(prefix: str, count: int, created_ms: int) -> list[TimelineItem]:
    return [
        TimelineItem(
            item_id=f"{prefix}{k}",
            kind=ItemKind.ASSISTANT,
            created_ms=created_ms,
            run_id="r",
            text=ROW_TEXT,
        )
        for k in range(count)
    ]


async def build(path: Path, tasks: int) -> None:
    async with await SqliteTaskStore.open(path) as store:
        for n in range(tasks):
            task_id = f"task-{n:05d}"
            await store.create_task(task_record(id=task_id, created_ms=n, updated_ms=n))
            await store.admit_user_message(
                task_id,
                TimelineItem(item_id="u", kind=ItemKind.USER, created_ms=n, text=ROW_TEXT),
                now_ms=n,
            )
            await store.upsert_items(task_id, rows("a", ROWS_PER_TASK, n), now_ms=n)
        await store.create_task(task_record(id="busy"))


async def time_deletes(path: Path, deletes: int, writes: int) -> list[float]:
    timings = []
    async with await SqliteTaskStore.open(path) as store:
        for n in range(deletes):
            for k in range(writes):
                await store.upsert_items("busy", rows(f"b{n}-{k}-", 1, n), now_ms=n)
            started = time.perf_counter()
            assert await store.delete_task(f"task-{n:05d}")
            timings.append((time.perf_counter() - started) * 1_000)
    return timings


def _no_checkpoint(conn: sqlite3.Connection) -> None:
    """The delete as it was: the commit alone."""


def summary(label: str, timings: list[float]) -> str:
    ordered = sorted(timings)
    p95 = ordered[int(len(ordered) * 0.95) - 1]
    return (
        f"{label:<22} median {statistics.median(ordered):7.3f} ms   p95 {p95:7.3f} ms   "
        f"max {ordered[-1]:7.3f} ms"
    )


async def main(tasks: int, deletes: int, writes_options: list[int]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "base"
        base.mkdir()
        started = time.perf_counter()
        await build(base / STORE_FILE_NAME, tasks)
        size = (base / STORE_FILE_NAME).stat().st_size
        print(
            f"store: {tasks} tasks, {size / 1e6:.1f} MB, built in "
            f"{time.perf_counter() - started:.1f} s; {deletes} deletes per run"
        )
        checkpoint = _sqlite._checkpoint_truncate
        for writes in writes_options:
            print(f"-- {writes} write(s) between deletes")
            for label, enabled in (("commit only (before)", False), ("commit + checkpoint", True)):
                copy = Path(scratch) / f"{writes}-{enabled}"
                shutil.copytree(base, copy)
                # The switch is the module's own function: the delete path is otherwise the same.
                _sqlite._checkpoint_truncate = checkpoint if enabled else _no_checkpoint
                try:
                    timings = await time_deletes(copy / STORE_FILE_NAME, deletes, writes)
                finally:
                    _sqlite._checkpoint_truncate = checkpoint
                print(summary(label, timings))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000)
    parser.add_argument("--deletes", type=int, default=200)
    parser.add_argument("--writes", type=int, action="append")
    args = parser.parse_args()
    if args.deletes > args.tasks:
        sys.exit("--deletes cannot exceed --tasks")
    trio.run(main, args.tasks, args.deletes, args.writes or [0, 20])
