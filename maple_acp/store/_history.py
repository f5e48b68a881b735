"""The history half of the SQLite store: timeline items, their columns and their encoding.

This module is the task history's SQL: every read and write of a task's items (including
the replay fast path and the copy a fork makes).

Functions here run on the store's worker thread with its one connection; a write function
expects the caller to hold an open write transaction (see ``_sqlite._write``).
"""

from __future__ import annotations

import bisect
import collections
import sqlite3
from collections.abc import Sequence
from typing import Any, Final

import orjson

from maple_acp.model import (
    MESSAGE_KINDS,
    FileDiff,
    ImageRef,
    ItemKind,
    MessageRow,
    PlanEntry,
    PlanPriority,
    PlanStatus,
    TimelineItem,
    ToolLocation,
    ToolState,
    ToolStatus,
)
from maple_acp.store._protocol import StoreError

_ITEM_COLUMNS = (
    "seq",
    "item_id",
    "kind",
    "run_id",
    "created_ms",
    "text",
    "tool_name",
    "tool_status",
    "tool_title",
    "raw_input",
    "raw_output",
    "output_text",
    "locations",
    "diffs",
    "plan",
    "images",
    "signature",
)
_ITEM_SELECT = ", ".join(_ITEM_COLUMNS)


def _encode_json(value: Any) -> str | None:
    """JSON text of a raw tool value; ``None`` is stored as SQL NULL."""
    if value is None:
        return None
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        raise StoreError("a tool's raw value is not JSON-serialisable") from exc


def _decode_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise StoreError("a stored JSON value is malformed") from exc


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _encode_locations(locations: Sequence[ToolLocation]) -> str:
    return _dumps([{"path": loc.path, "line": loc.line} for loc in locations])


#: What an empty location list looks like once encoded.
_EMPTY_LOCATIONS = _encode_locations(())


def _encode_diffs(diffs: Sequence[FileDiff]) -> str | None:
    if not diffs:
        return None
    return _dumps(
        [
            {"path": d.path, "new": d.new_text, "old": d.old_text, "truncated": d.truncated}
            for d in diffs
        ]
    )


def _encode_plan(plan: Sequence[PlanEntry]) -> str | None:
    if not plan:
        return None
    return _dumps(
        [
            {"content": e.content, "priority": e.priority.value, "status": e.status.value}
            for e in plan
        ]
    )


def _encode_images(images: Sequence[ImageRef]) -> str | None:
    if not images:
        return None
    return _dumps(
        [
            {
                "sha256": i.sha256,
                "mime": i.mime_type,
                "size": i.size,
                "width": i.width,
                "height": i.height,
                "uri": i.uri,
            }
            for i in images
        ]
    )


def _optional_int(value: object) -> bool:
    return value is None or type(value) is int


def _decode_images(text: str | None) -> tuple[ImageRef, ...]:
    images = []
    for obj in _json_objects(text, "image"):
        sha, mime, size = obj.get("sha256"), obj.get("mime"), obj.get("size")
        width, height, uri = obj.get("width"), obj.get("height"), obj.get("uri")
        if (
            not isinstance(sha, str)
            or not isinstance(mime, str)
            or type(size) is not int
            or not _optional_int(width)
            or not _optional_int(height)
            or not (uri is None or isinstance(uri, str))
        ):
            raise StoreError("a stored image reference is malformed")
        images.append(
            ImageRef(sha256=sha, mime_type=mime, size=size, width=width, height=height, uri=uri)
        )
    return tuple(images)


def _item_params(item: TimelineItem) -> tuple[Any, ...]:
    """Encode everything up front, so a value that cannot be stored fails before any write."""
    tool = item.tool
    if tool is None:
        tool_params: tuple[Any, ...] = (None,) * 8
    else:
        tool_params = (
            tool.name,
            tool.status.value,
            tool.title,
            _encode_json(tool.raw_input),
            _encode_json(tool.raw_output),
            tool.output_text,
            _encode_locations(tool.locations),
            _encode_diffs(tool.diffs),
        )
    return (
        item.item_id,
        item.kind.value,
        item.run_id,
        item.created_ms,
        item.text,
        *tool_params,
        _encode_plan(item.plan),
        _encode_images(item.images),
        item.signature,
    )


def _json_objects(text: str | None, what: str) -> list[dict[str, Any]]:
    """A stored JSON list of objects (``[]`` for NULL); ``StoreError`` for anything else."""
    value = _decode_json(text)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise StoreError(f"a stored {what} list is malformed")
    return value


def _decode_locations(text: str | None) -> tuple[ToolLocation, ...]:
    locations = []
    for obj in _json_objects(text, "tool location"):
        path, line = obj.get("path"), obj.get("line")
        if not isinstance(path, str) or not (line is None or type(line) is int):
            raise StoreError("a stored tool location is malformed")
        locations.append(ToolLocation(path=path, line=line))
    return tuple(locations)


def _decode_diffs(text: str | None) -> tuple[FileDiff, ...]:
    diffs = []
    for obj in _json_objects(text, "file diff"):
        path, new, old, truncated = (
            obj.get("path"),
            obj.get("new"),
            obj.get("old"),
            obj.get("truncated"),
        )
        if (
            not isinstance(path, str)
            or not isinstance(new, str)
            or not (old is None or isinstance(old, str))
            or not isinstance(truncated, bool)
        ):
            raise StoreError("a stored file diff is malformed")
        diffs.append(FileDiff(path=path, new_text=new, old_text=old, truncated=truncated))
    return tuple(diffs)


def _decode_plan(text: str | None) -> tuple[PlanEntry, ...]:
    entries = []
    for obj in _json_objects(text, "plan"):
        content, priority, status = obj.get("content"), obj.get("priority"), obj.get("status")
        if not (isinstance(content, str) and isinstance(priority, str) and isinstance(status, str)):
            raise StoreError("a stored plan entry is malformed")
        # An unknown priority or status is a ValueError, reported by the caller.
        entries.append(
            PlanEntry(content=content, priority=PlanPriority(priority), status=PlanStatus(status))
        )
    return tuple(entries)


#: Enum members by stored value: a dict lookup costs a fraction of calling the enum, and a
#: replay decodes every row of a history.
_KINDS = {kind.value: kind for kind in ItemKind}
_TOOL_STATUSES = {status.value: status for status in ToolStatus}


def _item_from_row(row: Sequence[Any]) -> TimelineItem:
    try:
        tool = None
        if row[6] is not None:
            tool = ToolState(
                name=row[6],
                status=_TOOL_STATUSES[row[7]],
                title=row[8] or "",
                raw_input=_decode_json(row[9]),
                raw_output=_decode_json(row[10]),
                output_text=row[11],
                locations=_decode_locations(row[12]) if row[12] != _EMPTY_LOCATIONS else (),
                diffs=_decode_diffs(row[13]) if row[13] is not None else (),
            )
        return TimelineItem(
            seq=row[0],
            item_id=row[1],
            kind=_KINDS[row[2]],
            run_id=row[3],
            created_ms=row[4],
            text=row[5],
            tool=tool,
            plan=_decode_plan(row[14]) if row[14] is not None else (),
            images=_decode_images(row[15]) if row[15] is not None else (),
            signature=row[16],
        )
    except (KeyError, ValueError) as exc:
        raise StoreError("a stored item row holds a value this version does not know") from exc


#: Positions within ``_item_params``' tuple, which follows ``_ITEM_COLUMNS`` without ``seq``.
_PARAM_ITEM_ID = _ITEM_COLUMNS.index("item_id") - 1
_PARAM_RUN_ID = _ITEM_COLUMNS.index("run_id") - 1
_PARAM_TOOL_NAME = _ITEM_COLUMNS.index("tool_name") - 1
_PARAM_RAW_INPUT = _ITEM_COLUMNS.index("raw_input") - 1
_PARAM_LOCATIONS = _ITEM_COLUMNS.index("locations") - 1
_PARAM_DIFFS = _ITEM_COLUMNS.index("diffs") - 1
_INSERT_ITEM = (
    f"INSERT INTO items (task_id, seq, {', '.join(_ITEM_COLUMNS[1:])}) "
    f"VALUES (?, ?, {', '.join('?' * (len(_ITEM_COLUMNS) - 1))})"
)
_REPLACE_ITEM = (
    f"UPDATE items SET {', '.join(f'{name} = ?' for name in _ITEM_COLUMNS[1:])} "
    "WHERE task_id = ? AND seq = ?"
)


_NEXT_SEQ = "SELECT COALESCE(MAX(seq), 0) + 1 FROM items WHERE task_id = ?"
_FIND_ITEM = (
    "SELECT seq, tool_name, raw_input, locations, diffs FROM items "
    "WHERE task_id = ? AND run_id IS ? AND item_id = ?"
)
#: Every statement a history write runs (the benchmark shows their query plans).
WRITE_STATEMENTS = (_NEXT_SEQ, _FIND_ITEM, _INSERT_ITEM, _REPLACE_ITEM)


def upsert_items_locked(
    conn: sqlite3.Connection, task_id: str, encoded: Sequence[tuple[Any, ...]]
) -> int | None:
    """Insert or replace items inside an open write transaction. Returns the lowest seq it
    wrote (None if nothing)."""
    next_seq = int(conn.execute(_NEXT_SEQ, (task_id,)).fetchone()[0])
    lowest: int | None = None
    for params in encoded:
        stored = conn.execute(
            _FIND_ITEM, (task_id, params[_PARAM_RUN_ID], params[_PARAM_ITEM_ID])
        ).fetchone()
        if stored is None:
            conn.execute(_INSERT_ITEM, (task_id, next_seq, *params))
            if lowest is None or next_seq < lowest:
                lowest = next_seq
            next_seq += 1
            continue
        seq, stored_tool_name, stored_raw_input, stored_locations, stored_diffs = stored
        values = list(params)
        # A later update of a tool call often carries only the result; the request that was
        # recorded first (its input, the files it named, the edit it proposed) must survive
        # it: history replays the request next to the result.
        if values[_PARAM_TOOL_NAME] is not None and stored_tool_name is not None:
            if values[_PARAM_RAW_INPUT] is None:
                values[_PARAM_RAW_INPUT] = stored_raw_input
            if values[_PARAM_LOCATIONS] == _EMPTY_LOCATIONS:
                values[_PARAM_LOCATIONS] = stored_locations
            if values[_PARAM_DIFFS] is None:
                values[_PARAM_DIFFS] = stored_diffs
        conn.execute(_REPLACE_ITEM, (*values, task_id, seq))
        if lowest is None or seq < lowest:
            lowest = seq
    return lowest


def encode_items(items: Sequence[TimelineItem]) -> list[tuple[Any, ...]]:
    """Every item's parameters, encoded before the write starts."""
    return [_item_params(item) for item in items]


#: A replay reads every row of a task, and Python's sqlite3 pays for each column of each row
#: (NULL ones included): a 15-column fetch of 10,000 text rows costs about 2.5x a fetch of
#: the text columns. So text rows are read with these columns, and only the rows that carry a
#: tool, a plan, images or a thought's signature (few, in a history) are read again whole.
_LEAN_COLUMNS = (
    "seq, item_id, kind, run_id, created_ms, text, "
    "tool_name IS NULL AND plan IS NULL AND images IS NULL AND signature IS NULL"
)
_READ_LEAN = f"SELECT {_LEAN_COLUMNS} FROM items WHERE task_id = ? ORDER BY seq"
_READ_WHOLE = (
    f"SELECT {_ITEM_SELECT} FROM items "
    "WHERE task_id = ? AND (tool_name IS NOT NULL OR plan IS NOT NULL OR images IS NOT NULL "
    "OR signature IS NOT NULL) "
    "ORDER BY seq"
)


def read_history(conn: sqlite3.Connection, task_id: str) -> list[TimelineItem]:
    # Both reads see one snapshot, as the single query they replace did.
    conn.execute("BEGIN")
    try:
        lean = conn.execute(_READ_LEAN, (task_id,)).fetchall()
        whole: dict[int, Any] = {}
        if not all(row[6] for row in lean):
            whole = {row[0]: row for row in conn.execute(_READ_WHOLE, (task_id,))}
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
    items: list[TimelineItem] = []
    append = items.append
    kinds = _KINDS
    try:
        for row in lean:
            if row[6]:
                append(
                    TimelineItem(
                        seq=row[0],
                        item_id=row[1],
                        kind=kinds[row[2]],
                        run_id=row[3],
                        created_ms=row[4],
                        text=row[5],
                    )
                )
            else:
                append(_item_from_row(whole[row[0]]))
    except KeyError as exc:
        raise StoreError("a stored item row holds a value this version does not know") from exc
    return items


#: A replay needs of a message row only its kind, id and text, and every column costs (see
#: above): the first query reads those three, with the kind NULL for a row that is not a plain
#: message; the second reads exactly those rows whole, in the same order.
_MESSAGE_ROW = (
    "tool_name IS NULL AND plan IS NULL AND images IS NULL AND kind IN "
    f"({', '.join(repr(kind.value) for kind in MESSAGE_KINDS)})"
)
_MESSAGE_KIND_OF: Final = {kind.value: kind for kind in MESSAGE_KINDS}
_READ_REPLAY = (
    f"SELECT CASE WHEN {_MESSAGE_ROW} THEN kind END, item_id, text "
    "FROM items WHERE task_id = ? ORDER BY seq"
)
_READ_REPLAY_WHOLE = (
    f"SELECT {_ITEM_SELECT} FROM items WHERE task_id = ? AND NOT ({_MESSAGE_ROW}) ORDER BY seq"
)


def read_replay(conn: sqlite3.Connection, task_id: str) -> list[TimelineItem | MessageRow]:
    """The task's rows for a replay: message rows as ``MessageRow`` values straight from
    SQLite's rows, every other row decoded whole."""
    conn.execute("BEGIN")
    try:
        rows: list[Any] = conn.execute(_READ_REPLAY, (task_id,)).fetchall()
        others = sum(1 for row in rows if row[0] is None)
        whole = conn.execute(_READ_REPLAY_WHOLE, (task_id,)).fetchall() if others else []
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
    if len(whole) != others:
        raise StoreError("a task's rows changed between the two reads of one snapshot")
    decoded = iter(whole)
    kind_of = _MESSAGE_KIND_OF
    # MessageRow._make's own way, without a call per row: a long replay is nearly all these.
    new = tuple.__new__
    return [
        _item_from_row(next(decoded))
        if kind is None
        else new(MessageRow, (kind_of[kind], item_id, text))
        for kind, item_id, text in rows
    ]


_COPY_COLUMNS = ", ".join(_ITEM_COLUMNS)
_LAST_SEQ_OF_ITEM = "SELECT MAX(seq) FROM items WHERE task_id = ? AND item_id = ?"
_COPY_ITEMS = (
    f"INSERT INTO items (task_id, {_COPY_COLUMNS}) "
    f"SELECT ?, {_COPY_COLUMNS} FROM items WHERE task_id = ? AND seq <= ? ORDER BY seq"
)
_NOTE_FORK = (
    "INSERT INTO forks (task_id, copied_seq) "
    "SELECT ?, COALESCE(MAX(seq), 0) FROM items WHERE task_id = ?"
)


def copy_items_locked(
    conn: sqlite3.Connection, source_id: str, target_id: str, up_to: str | None
) -> int | None:
    """Copy ``source_id``'s rows (every one, or those up to and including the last row of the
    item ``up_to``) to ``target_id``, keeping their ``seq``, inside an open write transaction.
    Returns how many were copied, or ``None`` when no row carries ``up_to``. The copied rows
    are noted in ``forks`` so that they do not count as the new task's own."""
    if up_to is None:
        last = (1 << 62,)
    else:
        last = conn.execute(_LAST_SEQ_OF_ITEM, (source_id, up_to)).fetchone()
        if last is None or last[0] is None:
            return None
    copied = conn.execute(_COPY_ITEMS, (target_id, source_id, last[0])).rowcount
    conn.execute(_NOTE_FORK, (target_id, target_id))
    return copied


def count_items(conn: sqlite3.Connection, task_id: str) -> int:
    row = conn.execute("SELECT COUNT(*) FROM items WHERE task_id = ?", (task_id,))
    return int(row.fetchone()[0])


#: Decoded histories kept for the tasks read last, at most this many items and characters of
#: text in all (an estimate of their memory: a 100-character row is ~0.4 KiB in Python).
MAX_CACHED_ITEMS = 50_000
MAX_CACHED_CHARS = 8_000_000
#: ... and of at most this many tasks (an empty history is not kept: it costs nothing to read).
MAX_CACHED_TASKS = 64
#: What one cached item costs besides its text, in the same unit.
_ITEM_OVERHEAD_CHARS = 300
_READ_FROM = f"SELECT {_ITEM_SELECT} FROM items WHERE task_id = ? AND seq >= ? ORDER BY seq"


def _weight(item: TimelineItem) -> int:
    weight = _ITEM_OVERHEAD_CHARS + len(item.text)
    tool = item.tool
    if tool is not None:
        weight += len(tool.output_text or "") + len(tool.title) + len(tool.name)
        for raw in (tool.raw_input, tool.raw_output):
            if raw is not None:
                weight += len(orjson.dumps(raw))
        for diff in tool.diffs:
            weight += len(diff.new_text) + len(diff.old_text or "") + len(diff.path)
    for entry in item.plan:
        weight += len(entry.content)
    # An image costs its reference here, never its bytes: those stay in ``blobs``.
    weight += len(item.images) * _ITEM_OVERHEAD_CHARS
    weight += len(item.signature or "")
    return weight


class HistoryCache:
    """The decoded histories of the tasks read last, kept up to date by this connection's
    own writes, so that a task read again (a load after a prompt, every turn's history) costs
    a list copy instead of a read and decode of every row.

    Used only on the store's worker thread. Exact by construction: a write re-reads from the
    database every row from the lowest seq it wrote, and any commit by another connection
    (``PRAGMA data_version`` changed) drops everything. Items are frozen, so the copies
    handed out share them safely."""

    def __init__(self) -> None:
        #: Per task: its items in seq order and their weight (see ``_weight``).
        self._tasks: collections.OrderedDict[str, tuple[list[TimelineItem], list[int]]] = (
            collections.OrderedDict()
        )
        self._weight = 0
        self._items = 0
        self._data_version: int | None = None

    def history(self, conn: sqlite3.Connection, task_id: str) -> list[TimelineItem]:
        cached = self.cached(conn, task_id)
        if cached is not None:
            return cached
        items = read_history(conn, task_id)
        self._add(task_id, items, [_weight(item) for item in items])
        return list(items)

    def cached(self, conn: sqlite3.Connection, task_id: str) -> list[TimelineItem] | None:
        """A copy of the task's history if it is cached, without reading anything."""
        self._check_version(conn)
        cached = self._tasks.get(task_id)
        if cached is None:
            return None
        self._tasks.move_to_end(task_id)
        return list(cached[0])

    def written(self, conn: sqlite3.Connection, task_id: str, lowest: int | None) -> None:
        """This connection committed a write of ``task_id``'s rows from seq ``lowest`` on."""
        self._check_version(conn)
        cached = self._tasks.get(task_id)
        if cached is None or lowest is None:
            return
        self.forget(task_id)
        fresh = [_item_from_row(row) for row in conn.execute(_READ_FROM, (task_id, lowest))]
        items, weights = cached
        keep = bisect.bisect_left(items, lowest, key=_seq)
        del items[keep:], weights[keep:]
        items.extend(fresh)
        weights.extend(_weight(item) for item in fresh)
        self._add(task_id, items, weights)

    def forget(self, task_id: str | None = None) -> None:
        """Drop one task (or every task) from the cache."""
        if task_id is None:
            self._tasks.clear()
            self._weight = self._items = 0
            return
        cached = self._tasks.pop(task_id, None)
        if cached is not None:
            self._weight -= sum(cached[1])
            self._items -= len(cached[0])

    def _add(self, task_id: str, items: list[TimelineItem], weights: list[int]) -> None:
        weight = sum(weights)
        if not items or len(items) > MAX_CACHED_ITEMS or weight > MAX_CACHED_CHARS:
            return
        self._tasks[task_id] = (items, weights)
        self._weight += weight
        self._items += len(items)
        while (
            self._weight > MAX_CACHED_CHARS
            or self._items > MAX_CACHED_ITEMS
            or len(self._tasks) > MAX_CACHED_TASKS
        ):
            _, (evicted, evicted_weights) = self._tasks.popitem(last=False)
            self._weight -= sum(evicted_weights)
            self._items -= len(evicted)

    def _check_version(self, conn: sqlite3.Connection) -> None:
        # Changes only when another connection (another process) committed to the file.
        version = int(conn.execute("PRAGMA data_version").fetchone()[0])
        if version != self._data_version:
            self.forget()
            self._data_version = version


def _seq(item: TimelineItem) -> int:
    return item.seq


_PUT_TRANSCRIPT = (
    "INSERT OR REPLACE INTO transcripts (task_id, run_id, covered_seq, body) VALUES "
    "(?, ?, COALESCE((SELECT MAX(seq) FROM items WHERE task_id = ? AND run_id = ?), 0), ?)"
)
_READ_TRANSCRIPTS = (
    "SELECT t.run_id, t.body FROM transcripts t WHERE t.task_id = ? AND t.covered_seq >= "
    "COALESCE((SELECT MAX(seq) FROM items i WHERE i.task_id = t.task_id "
    "AND i.run_id = t.run_id), 0)"
)


def put_transcript(conn: sqlite3.Connection, task_id: str, run_id: str, body: bytes) -> None:
    conn.execute(_PUT_TRANSCRIPT, (task_id, run_id, task_id, run_id, body))


def read_transcripts(conn: sqlite3.Connection, task_id: str) -> dict[str, bytes]:
    return {str(run): bytes(body) for run, body in conn.execute(_READ_TRANSCRIPTS, (task_id,))}
