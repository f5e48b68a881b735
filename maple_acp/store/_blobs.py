"""Image bytes in the SQLite store: one ``blobs`` row per SHA-256, and ``blob_refs`` saying
which tasks hold which blob, so that a blob outlives no task that carried it.

Functions here run on the store's worker thread inside an open write transaction (except
``read_blob``), like ``_history``'s.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Mapping, Sequence

import orjson

from maple_acp.model import ImageRef
from maple_acp.store._protocol import StoreError

_PUT_BLOB = "INSERT OR IGNORE INTO blobs (sha256, data) VALUES (?, ?)"
_PUT_REF = "INSERT OR IGNORE INTO blob_refs (task_id, sha256) VALUES (?, ?)"
_HAS_BLOB = "SELECT 1 FROM blobs WHERE sha256 = ?"
_READ_BLOB = "SELECT data FROM blobs WHERE sha256 = ?"
#: After a delete: every blob no task refers to any more goes (``secure_delete`` zeroes it).
_DROP_UNREFERENCED = (
    "DELETE FROM blobs WHERE NOT EXISTS "
    "(SELECT 1 FROM blob_refs WHERE blob_refs.sha256 = blobs.sha256)"
)
_IMAGE_LISTS = "SELECT images FROM items WHERE task_id = ? AND images IS NOT NULL"


def put_images_locked(
    conn: sqlite3.Connection,
    task_id: str,
    images: Sequence[ImageRef],
    blobs: Mapping[str, bytes],
) -> None:
    """Store the bytes of ``images`` (once per hash) and refer ``task_id`` to each. Every
    image must come with its bytes in ``blobs`` or be stored already; a blob whose bytes do
    not hash to its key is refused (``StoreError``), so one hash never names two contents."""
    for image in images:
        data = blobs.get(image.sha256)
        if data is not None:
            if hashlib.sha256(data).hexdigest() != image.sha256:
                raise StoreError("an image's bytes do not match its hash")
            conn.execute(_PUT_BLOB, (image.sha256, data))
        elif conn.execute(_HAS_BLOB, (image.sha256,)).fetchone() is None:
            raise StoreError("an image was admitted without its bytes")
        conn.execute(_PUT_REF, (task_id, image.sha256))


def refer_copied_locked(conn: sqlite3.Connection, task_id: str) -> None:
    """Refer ``task_id`` to every blob its rows name (after a fork copied them)."""
    for (text,) in conn.execute(_IMAGE_LISTS, (task_id,)).fetchall():
        try:
            listed = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise StoreError("a stored image list is malformed") from exc
        for entry in listed if isinstance(listed, list) else ():
            sha = entry.get("sha256") if isinstance(entry, dict) else None
            if isinstance(sha, str):
                conn.execute(_PUT_REF, (task_id, sha))


def drop_unreferenced_locked(conn: sqlite3.Connection) -> None:
    conn.execute(_DROP_UNREFERENCED)


def read_blob(conn: sqlite3.Connection, sha256: str) -> bytes | None:
    row = conn.execute(_READ_BLOB, (sha256,)).fetchone()
    return None if row is None else bytes(row[0])
