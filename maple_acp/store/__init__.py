"""Persistence for the runtime: the ``TaskStore`` protocol and its records."""

from maple_acp.model import (
    FileDiff,
    GoalRecord,
    GoalStatus,
    ItemKind,
    PlanEntry,
    PlanPriority,
    PlanStatus,
    TaskPage,
    TaskPolicy,
    TaskQuery,
    TaskRecord,
    TaskSurface,
    TimelineItem,
    ToolLocation,
    ToolState,
    ToolStatus,
    Usage,
)
from maple_acp.store._lock import DataDirectoryLocked
from maple_acp.store._protocol import InvalidCursor, StoreError, TaskStore
from maple_acp.store._sqlite import MAX_PAGE, SqliteTaskStore

__all__ = [
    "MAX_PAGE",
    "DataDirectoryLocked",
    "FileDiff",
    "GoalRecord",
    "GoalStatus",
    "InvalidCursor",
    "ItemKind",
    "PlanEntry",
    "PlanPriority",
    "PlanStatus",
    "SqliteTaskStore",
    "StoreError",
    "TaskPage",
    "TaskPolicy",
    "TaskQuery",
    "TaskRecord",
    "TaskStore",
    "TaskSurface",
    "TimelineItem",
    "ToolLocation",
    "ToolState",
    "ToolStatus",
    "Usage",
]
