"""Task-store fixtures for hosts' own tests: a real SQLite store in a temporary directory.

Use with pytest's ``tmp_path``::

    async def test_something(tmp_path):
        async with temp_store(tmp_path) as store:
            await store.create_task(task_record(id="t1"))
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from maple_acp.model import TaskRecord, TaskSurface
from maple_acp.runtime import hold_virtual_time
from maple_acp.store import SqliteTaskStore

#: The file name used inside the directory a test hands over.
STORE_FILE_NAME = "tasks.sqlite3"


async def open_temp_store(directory: str | os.PathLike[str]) -> SqliteTaskStore:
    """Open a store file inside ``directory`` (usually ``tmp_path``). The caller closes it
    (``await store.aclose()``); opening the same directory again reopens the same file, which
    is how a test simulates a restart."""
    path = os.path.join(os.fspath(directory), STORE_FILE_NAME)
    # Opening runs in the store's thread: a mock clock must not jump while it does.
    return await hold_virtual_time(SqliteTaskStore.open)(path)


@asynccontextmanager
async def temp_store(directory: str | os.PathLike[str]) -> AsyncIterator[SqliteTaskStore]:
    """``open_temp_store`` as an async context manager that closes the store on exit."""
    store = await open_temp_store(directory)
    async with store:
        yield store


def task_record(**fields: Any) -> TaskRecord:
    """A valid ``TaskRecord`` with test defaults (a desktop task of account ``"account"`` in
    ``/project``, created and updated at 1000 ms); keyword arguments override any field."""
    defaults: dict[str, Any] = {
        "id": "task",
        "account": "account",
        "root": "/project",
        "created_ms": 1_000,
        "updated_ms": 1_000,
        "surface": TaskSurface.DESKTOP,
    }
    defaults.update(fields)
    return TaskRecord(**defaults)
