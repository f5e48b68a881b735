"""Persistence for the runtime: the ``TaskStore`` protocol and the SQLite store.

The records a store reads and writes (``TaskRecord``, ``TimelineItem``, ...) have one public
home, :mod:`maple_acp.model`; this face does not repeat them.
"""

from maple_acp.store._lock import DataDirectoryLocked, check_data_directory_free
from maple_acp.store._protocol import ForkSourceMissing, InvalidCursor, StoreError, TaskStore
from maple_acp.store._sqlite import MAX_PAGE, SqliteTaskStore

__all__ = [
    "MAX_PAGE",
    "DataDirectoryLocked",
    "ForkSourceMissing",
    "InvalidCursor",
    "SqliteTaskStore",
    "StoreError",
    "TaskStore",
    "check_data_directory_free",
]
