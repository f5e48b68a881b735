"""Versioned schema of the SQLite task store.

The schema version lives in ``PRAGMA user_version``: version ``n`` means the first ``n`` steps
of ``MIGRATIONS`` have been applied. A step is never edited once released; a change is a new
step appended to the list. Each step runs in its own ``BEGIN IMMEDIATE`` transaction together
with the version bump, so a crash mid-migration leaves the file at the previous version.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import orjson

from maple_acp.store._protocol import StoreError

#: Step 1: the tables. Columns map one-to-one onto the records in ``maple_acp.model``; there is no
#: column for anything a connection supplies as a credential, and none may be added.
_TABLES = """
CREATE TABLE tasks (
    id TEXT PRIMARY KEY NOT NULL,
    account TEXT NOT NULL,
    root TEXT NOT NULL,
    title TEXT NOT NULL,
    user_renamed INTEGER NOT NULL CHECK (user_renamed IN (0, 1)),
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    policy TEXT NOT NULL,
    surface TEXT NOT NULL,
    model TEXT,
    archived INTEGER NOT NULL CHECK (archived IN (0, 1)),
    provisional INTEGER NOT NULL CHECK (provisional IN (0, 1)),
    provisional_expires_ms INTEGER
);

CREATE TABLE items (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    item_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    run_id TEXT,
    created_ms INTEGER NOT NULL,
    text TEXT NOT NULL,
    tool_name TEXT,
    tool_status TEXT,
    tool_title TEXT,
    raw_input TEXT,
    raw_output TEXT,
    output_text TEXT,
    locations TEXT,
    PRIMARY KEY (task_id, seq),
    UNIQUE (task_id, item_id)
) WITHOUT ROWID;

CREATE TABLE usage (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run_id TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    total_tokens INTEGER NOT NULL,
    cache_read_tokens INTEGER NOT NULL,
    cache_write_tokens INTEGER NOT NULL,
    PRIMARY KEY (task_id, run_id)
) WITHOUT ROWID;

CREATE TABLE trust (
    account TEXT NOT NULL,
    root TEXT NOT NULL,
    trusted INTEGER NOT NULL CHECK (trusted IN (0, 1)),
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (account, root)
) WITHOUT ROWID;

CREATE TABLE goals (
    task_id TEXT PRIMARY KEY NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    objective TEXT NOT NULL,
    status TEXT NOT NULL,
    iterations INTEGER NOT NULL,
    last_reason TEXT,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    token_budget INTEGER,
    tokens_used INTEGER
) WITHOUT ROWID;
"""

#: Step 2: indexes for listing and sweeping. A list page walks one of these in key order and
#: stops after ``limit + 1`` matching rows, so its cost does not grow with the number of tasks.
#: The two partial indexes hold only listable rows (not provisional, not archived) keyed by
#: policy: an external caller's page (one policy, hidden rows hidden) is a pure range scan.
#: Other queries walk the full indexes; their trailing filter columns let a rejected row be
#: skipped from the index entry alone, without reading the table row.
_INDEXES = """
CREATE INDEX tasks_by_account
    ON tasks (account, updated_ms DESC, id DESC, policy, provisional, archived);
CREATE INDEX tasks_by_account_root
    ON tasks (account, root, updated_ms DESC, id DESC, policy, provisional, archived);
CREATE INDEX tasks_visible_by_account_policy
    ON tasks (account, policy, updated_ms DESC, id DESC)
    WHERE provisional = 0 AND archived = 0;
CREATE INDEX tasks_visible_by_account_root_policy
    ON tasks (account, root, policy, updated_ms DESC, id DESC)
    WHERE provisional = 0 AND archived = 0;
CREATE INDEX tasks_provisional ON tasks (provisional_expires_ms) WHERE provisional = 1;
"""

#: Step 3, schema: a tool row's file edits and a plan row's entries, each as JSON text (NULL
#: when the row has none).
_DIFFS_AND_PLANS = """
ALTER TABLE items ADD COLUMN diffs TEXT;
ALTER TABLE items ADD COLUMN plan TEXT
"""


def _locations_to_objects(conn: sqlite3.Connection) -> None:
    """Step 3, data: a tool location became a path with an optional line. Rows written before
    hold a JSON list of path strings; each string becomes ``{"path": string}``. Done in Python
    rather than with ``json_each`` because SQLite does not promise the order in which an
    aggregate sees a list's elements, and the order of locations is part of the record."""
    rows = conn.execute(
        "SELECT task_id, seq, locations FROM items "
        "WHERE locations IS NOT NULL AND locations != '[]'"
    ).fetchall()
    for task_id, seq, text in rows:
        try:
            paths = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise StoreError("a stored tool location list is malformed") from exc
        if not isinstance(paths, list):
            raise StoreError("a stored tool location list is malformed")
        converted = [{"path": p} if isinstance(p, str) else p for p in paths]
        conn.execute(
            "UPDATE items SET locations = ? WHERE task_id = ? AND seq = ?",
            (orjson.dumps(converted).decode(), task_id, seq),
        )


def _step_3(conn: sqlite3.Connection) -> None:
    for statement in _split(_DIFFS_AND_PLANS):
        conn.execute(statement)
    _locations_to_objects(conn)


#: Step 4: an item is identified by its run and its id within the task, and the index that
#: finds it is ordered by run. The unique (task_id, item_id) index it replaces was ordered by
#: item id alone: ids that backends choose (a provider's tool call ids) land all over a big
#: task's part of that index, so a write of k new items touched min(k, all) of its pages and
#: its cost grew with the task's history. Ordered by run, a run's items sit side by side.
#: A unique constraint cannot be dropped in place, so the table is rebuilt (same columns, same
#: order, same clustering by (task_id, seq)).
_ITEMS_BY_RUN = """
CREATE TABLE items_v4 (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    item_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    run_id TEXT,
    created_ms INTEGER NOT NULL,
    text TEXT NOT NULL,
    tool_name TEXT,
    tool_status TEXT,
    tool_title TEXT,
    raw_input TEXT,
    raw_output TEXT,
    output_text TEXT,
    locations TEXT,
    diffs TEXT,
    plan TEXT,
    PRIMARY KEY (task_id, seq)
) WITHOUT ROWID;
INSERT INTO items_v4 SELECT task_id, seq, item_id, kind, run_id, created_ms, text, tool_name,
    tool_status, tool_title, raw_input, raw_output, output_text, locations, diffs, plan
    FROM items;
DROP TABLE items;
ALTER TABLE items_v4 RENAME TO items;
CREATE UNIQUE INDEX items_by_run ON items (task_id, run_id, item_id)
"""

#: Step 5: items become a rowid table, ordered within a task by a unique (task_id, seq) index.
#: A WITHOUT ROWID table keeps whole rows in its b-tree, interior pages included, and SQLite
#: compares a search key against a row that spills onto overflow pages by reading the whole
#: row: a long message (a 1 MB prompt) that became a divider key made every later insert near
#: it read its overflow chain, and a 10,000-item write took 1.2 s instead of 0.06 s. In a
#: rowid table the long text lives only in the leaf, and the indexes hold short keys. The
#: rowid follows insertion, so a task's rows still sit mostly side by side.
_ITEMS_WITH_ROWID = """
CREATE TABLE items_v5 (
    id INTEGER PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    item_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    run_id TEXT,
    created_ms INTEGER NOT NULL,
    text TEXT NOT NULL,
    tool_name TEXT,
    tool_status TEXT,
    tool_title TEXT,
    raw_input TEXT,
    raw_output TEXT,
    output_text TEXT,
    locations TEXT,
    diffs TEXT,
    plan TEXT
);
INSERT INTO items_v5 (task_id, seq, item_id, kind, run_id, created_ms, text, tool_name,
    tool_status, tool_title, raw_input, raw_output, output_text, locations, diffs, plan)
    SELECT task_id, seq, item_id, kind, run_id, created_ms, text, tool_name, tool_status,
    tool_title, raw_input, raw_output, output_text, locations, diffs, plan
    FROM items ORDER BY task_id, seq;
DROP TABLE items;
ALTER TABLE items_v5 RENAME TO items;
CREATE UNIQUE INDEX items_by_seq ON items (task_id, seq);
CREATE UNIQUE INDEX items_by_run ON items (task_id, run_id, item_id)
"""

#: Step 6: a task's session mode and thinking effort (NULL: the host's and the backend's
#: defaults), and the directories it may work in besides its root, as a JSON array of
#: canonical paths.
_TASK_SETTINGS = """
ALTER TABLE tasks ADD COLUMN mode TEXT;
ALTER TABLE tasks ADD COLUMN thought_level TEXT;
ALTER TABLE tasks ADD COLUMN additional_directories TEXT NOT NULL DEFAULT '[]'
"""

#: Step 7: a forked task's copied history. Its rows up to ``copied_seq`` came with the fork,
#: so they do not make the task "touched": an unprompted fork is swept like any provisional.
_FORKS = """
CREATE TABLE forks (
    task_id TEXT PRIMARY KEY NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    copied_seq INTEGER NOT NULL
)
"""

#: Step 8: prompt images. A user row lists its images (``items.images``, a JSON array of
#: references: hash, type, size, dimensions, URI); the bytes live once per SHA-256 in
#: ``blobs``, however many messages or tasks carry them. ``blob_refs`` says which tasks hold
#: which blob, so that deleting a task (its refs go with it) lets the blobs nobody holds be
#: dropped in the same transaction.
_BLOBS = """
ALTER TABLE items ADD COLUMN images TEXT;
CREATE TABLE blobs (
    sha256 TEXT PRIMARY KEY NOT NULL,
    data BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE blob_refs (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    sha256 TEXT NOT NULL,
    PRIMARY KEY (task_id, sha256)
) WITHOUT ROWID;
CREATE INDEX blob_refs_by_blob ON blob_refs (sha256)
"""

#: Step 9: a thought's provider signature (``items.signature``): thinking that a provider
#: accepts back only with the signature it gave, verbatim, is sent back in later turns too.
_THOUGHT_SIGNATURES = """
ALTER TABLE items ADD COLUMN signature TEXT
"""

#: Step 10: what a provider engine sent for a run (``transcripts``), so that later requests
#: carry the same bytes: tool results with their exit codes, the provider's call ids and
#: argument text. ``covered_seq`` is the run's last item when it was written; a run with items
#: past it (a later turn of the run that failed) is rebuilt from its items instead.
_TRANSCRIPTS = """
CREATE TABLE transcripts (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run_id TEXT NOT NULL,
    covered_seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (task_id, run_id)
) WITHOUT ROWID
"""

#: Step 11: prompt idempotency keys (``prompt_keys``): which user message each of a task's
#: latest keys inserted, so that a prompt sent again with its key, even after a restart,
#: inserts nothing. ``seq`` orders a task's keys for forgetting the oldest.
_PROMPT_KEYS = """
CREATE TABLE prompt_keys (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    message_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (task_id, key)
) WITHOUT ROWID;
CREATE INDEX prompt_keys_by_seq ON prompt_keys (task_id, seq)
"""

#: Step 12: the boolean options set for a task (a JSON object of option id to value), kept
#: with it like its mode and thinking effort.
_BOOLEAN_OPTIONS = """
ALTER TABLE tasks ADD COLUMN boolean_options TEXT NOT NULL DEFAULT '{}'
"""

#: Step 13: child sessions (``tasks.parent_id``, ``tasks.parent_tool_id``): a task a parent's
#: turn delegated to, deleted with its parent; the tool call that delegated it places its
#: transcript in the parent's replay.
_CHILDREN = """
ALTER TABLE tasks ADD COLUMN parent_id TEXT REFERENCES tasks (id) ON DELETE CASCADE;
ALTER TABLE tasks ADD COLUMN parent_tool_id TEXT;
CREATE INDEX tasks_by_parent ON tasks (parent_id) WHERE parent_id IS NOT NULL
"""

#: One schema step: a SQL script, or a function that runs inside the step's transaction (for
#: a change of stored values that SQL cannot state exactly).
Step = str | Callable[[sqlite3.Connection], None]

#: Ordered schema steps; ``len(MIGRATIONS)`` is the version this library writes.
MIGRATIONS: tuple[Step, ...] = (
    _TABLES,
    _INDEXES,
    _step_3,
    _ITEMS_BY_RUN,
    _ITEMS_WITH_ROWID,
    _TASK_SETTINGS,
    _FORKS,
    _BLOBS,
    _THOUGHT_SIGNATURES,
    _TRANSCRIPTS,
    _PROMPT_KEYS,
    _BOOLEAN_OPTIONS,
    _CHILDREN,
)

SCHEMA_VERSION = len(MIGRATIONS)


def _split(script: str) -> list[str]:
    """Statements of a step, so each runs through ``execute`` inside our own transaction
    (``executescript`` would commit on its own)."""
    return [s.strip() for s in script.split(";") if s.strip()]


def schema_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0])


def migrate(conn: sqlite3.Connection, *, target: int = SCHEMA_VERSION) -> int:
    """Bring the file up to ``target`` (normally the newest version). Returns the version found.

    Refuses a file written by a newer library: its schema may hold meaning this code would
    silently drop.
    """
    if not 0 <= target <= SCHEMA_VERSION:
        raise ValueError(f"no schema version {target}")
    found = schema_version(conn)
    if found > SCHEMA_VERSION:
        raise StoreError(
            f"the task store was written by a newer version (schema {found}); "
            f"this version reads schema {SCHEMA_VERSION} or older"
        )
    for version in range(found, target):
        conn.execute("BEGIN IMMEDIATE")
        try:
            step = MIGRATIONS[version]
            if isinstance(step, str):
                for statement in _split(step):
                    conn.execute(statement)
            else:
                step(conn)
            # PRAGMA user_version lives in the file header, which is written by the same
            # transaction, so the step and its version land together or not at all.
            conn.execute(f"PRAGMA user_version = {version + 1}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return found
