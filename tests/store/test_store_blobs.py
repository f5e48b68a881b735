"""Prompt images in the SQLite store: the bytes once per SHA-256 however many messages and
tasks carry them, the references kept with the user row and replayed, forks sharing them,
and a blob dropped (and zeroed) with the last task that held it."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from maple_acp.model import ImageRef, ItemKind, TimelineItem
from maple_acp.runtime import check_image
from maple_acp.store import SqliteTaskStore, StoreError
from maple_acp.testing.images import jpeg, png
from maple_acp.testing.store import task_record, temp_store

PICTURE = png(2, 3)
PHOTO = jpeg(4, 5)


def ref(data: bytes) -> ImageRef:
    return check_image(data, "image/png" if data.startswith(b"\x89") else "image/jpeg").ref


def user(item_id: str, *images: bytes, text: str = "see") -> TimelineItem:
    return TimelineItem(
        item_id=item_id,
        kind=ItemKind.USER,
        created_ms=1,
        run_id=f"r-{item_id}",
        text=text,
        images=tuple(ref(data) for data in images),
    )


def blobs(*images: bytes) -> dict[str, bytes]:
    return {hashlib.sha256(data).hexdigest(): data for data in images}


def blob_rows(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM blobs").fetchone()[0])
    finally:
        conn.close()


async def test_an_image_is_stored_once_and_comes_back_with_its_message(
    store: SqliteTaskStore, store_path: Path
) -> None:
    for task in ("a", "b"):
        await store.create_task(task_record(id=task, root="/p"))
    first = user("u1", PICTURE, PHOTO, PICTURE)
    await store.admit_user_message("a", first, now_ms=2, blobs=blobs(PICTURE, PHOTO))
    await store.admit_user_message("a", user("u2", PICTURE), now_ms=3, blobs=blobs(PICTURE))
    await store.admit_user_message("b", user("u1", PICTURE), now_ms=4, blobs=blobs(PICTURE))
    assert blob_rows(store_path) == 2

    [stored, _] = await store.history("a")
    assert stored.images == first.images
    assert [i.width for i in stored.images] == [2, 4, 2]
    rows = await store.replay_rows("a")
    assert not isinstance(rows[0], tuple)
    assert rows[0].images == first.images
    assert await store.read_blob(first.images[1].sha256) == PHOTO
    assert await store.read_blob("0" * 64) is None


async def test_a_fresh_read_and_a_cached_read_agree(tmp_path: Path) -> None:
    item = user("u1", PHOTO)
    async with temp_store(tmp_path) as store:
        await store.create_task(task_record(id="a", root="/p"))
        await store.admit_user_message("a", item, now_ms=2, blobs=blobs(PHOTO))
    async with temp_store(tmp_path) as store:
        [row] = await store.replay_rows("a")
        assert not isinstance(row, tuple)
        assert row.images == item.images
        [whole] = await store.history("a")
        assert whole.images == item.images


async def test_a_blob_goes_with_the_last_task_that_held_it(
    store: SqliteTaskStore, store_path: Path
) -> None:
    for task in ("a", "b"):
        await store.create_task(task_record(id=task, root="/p"))
    await store.admit_user_message(
        "a", user("u1", PICTURE, PHOTO), now_ms=2, blobs=blobs(PICTURE, PHOTO)
    )
    await store.admit_user_message("b", user("u1", PICTURE), now_ms=3, blobs=blobs(PICTURE))
    assert await store.delete_task("a")
    # The photo was only a's; the picture is b's too.
    assert blob_rows(store_path) == 1
    assert await store.read_blob(ref(PHOTO).sha256) is None
    assert await store.read_blob(ref(PICTURE).sha256) == PICTURE
    assert await store.delete_task("b")
    assert blob_rows(store_path) == 0


async def test_a_fork_holds_the_images_it_copied(store: SqliteTaskStore, store_path: Path) -> None:
    await store.create_task(task_record(id="src", root="/p"))
    await store.admit_user_message("src", user("u1", PICTURE), now_ms=2, blobs=blobs(PICTURE))
    await store.admit_user_message("src", user("u2", PHOTO), now_ms=3, blobs=blobs(PHOTO))
    await store.fork_task("src", task_record(id="fork", root="/p", provisional=True), up_to="u1")
    assert await store.delete_task("src")
    # The fork copied only the first message: the picture stays, the photo goes.
    assert await store.read_blob(ref(PICTURE).sha256) == PICTURE
    assert await store.read_blob(ref(PHOTO).sha256) is None
    [copied] = await store.history("fork")
    assert copied.images == (ref(PICTURE),)


async def test_an_image_without_its_bytes_or_with_other_bytes_is_refused(
    store: SqliteTaskStore, store_path: Path
) -> None:
    await store.create_task(task_record(id="a", root="/p", provisional=True))
    with pytest.raises(StoreError, match="without its bytes"):
        await store.admit_user_message("a", user("u1", PICTURE), now_ms=2)
    wrong = {ref(PICTURE).sha256: PHOTO}
    with pytest.raises(StoreError, match="do not match"):
        await store.admit_user_message("a", user("u1", PICTURE), now_ms=2, blobs=wrong)
    # Nothing of either attempt was written, and the task is still provisional.
    assert await store.item_count("a") == 0
    assert blob_rows(store_path) == 0
    task = await store.get_task("a")
    assert task is not None
    assert task.provisional
