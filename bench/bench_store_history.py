"""How long the store takes to hand over a whole history for replay.

Writes one task of ``--items`` items (10,000 by default: text, thoughts, tool rows with JSON
input and output) through the public API, then times ``SqliteTaskStore.history`` (one query,
rows decoded on the store's worker thread) and, beside it, the bare query and the decoding
alone, so the split between SQLite and Python is visible. Prints medians and the cost per
item, to set against the ~10 us of host CPU a live streamed update costs (docs/protocol.md,
performance targets).

Usage: python bench/bench_store_history.py [--items N] [--repeat N]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import trio
from bench_store_growth import run_items, task

from maple_acp.store import SqliteTaskStore
from maple_acp.store._history import _ITEM_SELECT, _item_from_row


def raw_timings(path: Path, task_id: str) -> tuple[float, float]:
    """Seconds of the bare query and of decoding its rows, on a connection of our own."""
    conn = sqlite3.connect(path)
    try:
        start = time.perf_counter()
        rows = conn.execute(
            f"SELECT {_ITEM_SELECT} FROM items WHERE task_id = ? ORDER BY seq", (task_id,)
        ).fetchall()
        fetched = time.perf_counter()
        [_item_from_row(row) for row in rows]
        return fetched - start, time.perf_counter() - fetched
    finally:
        conn.close()


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-store-history-") as tmp:
        path = Path(tmp) / "tasks.sqlite3"
        async with await SqliteTaskStore.open(path) as store:
            await store.create_task(task("t", 1))
            await store.upsert_items("t", run_items(random.Random(1), "run", args.items), now_ms=2)
            whole, query, decode = [], [], []
            for _ in range(args.repeat):
                start = time.perf_counter()
                history = await store.history("t")
                whole.append(time.perf_counter() - start)
                assert len(history) == args.items
                fetched, decoded = await trio.to_thread.run_sync(raw_timings, path, "t")
                query.append(fetched)
                decode.append(decoded)
    for name, times in (("history()", whole), ("  the query", query), ("  decoding", decode)):
        median = statistics.median(times)
        print(
            f"{name:<12} {median * 1e3:7.1f} ms for {args.items:,} items "
            f"({median / args.items * 1e6:.1f} us per item), median of {args.repeat}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=9)
    trio.run(main, parser.parse_args())
