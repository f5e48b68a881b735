"""Once a delete returned, the task's text is on disk nowhere: not in the store file, not in its
``-wal``, not in its ``-shm`` — while the store is still open, not only after a clean close."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from maple_acp.model import ItemKind, TimelineItem
from maple_acp.store import SqliteTaskStore, _sqlite
from maple_acp.testing.store import STORE_FILE_NAME, open_temp_store, task_record, temp_store

#: A phrase nothing else in the file can contain.
SECRET = "quokka-lantern-7f3e9a"
KEPT = "heron-teapot-41c2d8"
#: Long enough to spill over several overflow pages (the page size is 4 KiB).
LONG_REPEATS = 2_000


def on_disk(store_path: Path) -> dict[str, bytes]:
    """The raw bytes of the store file and its companions, as another process would read them."""
    found = {}
    for suffix in ("", "-wal", "-shm"):
        path = Path(f"{store_path}{suffix}")
        if path.exists():
            found[path.name] = path.read_bytes()
    return found


def holding(files: dict[str, bytes], text: str) -> list[str]:
    needle = text.encode()
    return sorted(name for name, data in files.items() if needle in data)


async def fill(store: SqliteTaskStore, task_id: str, text: str) -> None:
    await store.create_task(task_record(id=task_id))
    await store.admit_user_message(
        task_id,
        TimelineItem(item_id="u", kind=ItemKind.USER, created_ms=1, run_id="r", text=text),
        now_ms=2_000,
    )
    await store.rename_task(task_id, f"about {text}", user_renamed=True, now_ms=2_001)
    await store.upsert_items(
        task_id,
        [
            TimelineItem(
                item_id="a",
                kind=ItemKind.ASSISTANT,
                created_ms=2,
                run_id="r",
                text=f"{text} " * LONG_REPEATS,
            )
        ],
        now_ms=2_002,
    )


async def test_a_deleted_tasks_text_is_in_no_file_while_the_store_is_open(
    tmp_path: Path,
) -> None:
    store_path = tmp_path / STORE_FILE_NAME
    async with temp_store(tmp_path) as store:
        await fill(store, "kept", KEPT)
        await fill(store, "doomed", SECRET)
        before = on_disk(store_path)
        assert holding(before, SECRET), "the text never reached the disk: nothing to check"
        assert await store.delete_task("doomed")
        after = on_disk(store_path)
        assert holding(after, SECRET) == []
        # The files were read, and a kept task is untouched by the scrubbing.
        assert holding(after, KEPT)
        assert (await store.history("kept"))[0].text == KEPT
        assert await store.get_task("doomed") is None


async def test_secure_delete_is_set_on_the_stores_connection(tmp_path: Path) -> None:
    store = await open_temp_store(tmp_path)
    async with store:
        setting = await store._run(lambda conn: conn.execute("PRAGMA secure_delete").fetchone())
    assert setting == (1,)


async def test_a_delete_a_reader_keeps_from_checkpointing_still_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Short, so the checkpoint gives up quickly on the reader below.
    monkeypatch.setattr(_sqlite, "BUSY_TIMEOUT_MS", 100)
    store_path = tmp_path / STORE_FILE_NAME
    async with temp_store(tmp_path) as store:
        await fill(store, "doomed", SECRET)
        await fill(store, "next", KEPT)
        # Another process reading an older snapshot (a backup, say) pins the WAL.
        reader = sqlite3.connect(store_path, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM tasks").fetchone()
        try:
            with caplog.at_level(logging.WARNING, logger=_sqlite.__name__):
                assert await store.delete_task("doomed")
            assert await store.get_task("doomed") is None
            assert any("WAL" in record.getMessage() for record in caplog.records)
            assert SECRET not in caplog.text
        finally:
            reader.execute("COMMIT")
            reader.close()
        # The next delete's checkpoint takes the text out as well.
        assert await store.delete_task("next")
        assert holding(on_disk(store_path), SECRET) == []
