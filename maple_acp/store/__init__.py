"""Persistence for the runtime: the ``TaskStore`` protocol and its records."""

from maple_acp.model import (
    GoalRecord,
    GoalStatus,
    ItemKind,
    TaskPage,
    TaskPolicy,
    TaskQuery,
    TaskRecord,
    TaskSurface,
    TimelineItem,
    ToolState,
    ToolStatus,
    Usage,
)
from maple_acp.store._protocol import InvalidCursor, StoreError, TaskStore
from maple_acp.store._sqlite import MAX_PAGE, SqliteTaskStore

__all__ = [
    "MAX_PAGE",
    "GoalRecord",
    "GoalStatus",
    "InvalidCursor",
    "ItemKind",
    "SqliteTaskStore",
    "StoreError",
    "TaskPage",
    "TaskPolicy",
    "TaskQuery",
    "TaskRecord",
    "TaskStore",
    "TaskSurface",
    "TimelineItem",
    "ToolState",
    "ToolStatus",
    "Usage",
]
