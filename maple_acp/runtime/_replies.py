"""What ``AgentService`` answers with: plain records, no behaviour."""

from __future__ import annotations

import enum

import attrs

from maple_acp.model import TaskRecord


@attrs.frozen(kw_only=True)
class ServiceStatus:
    ready: bool
    account: str | None
    generation: int
    draining: bool
    #: Leases not yet released (revoked ones still cleaning up included).
    leases: int
    active_runs: int


@attrs.frozen(kw_only=True)
class TaskListing:
    tasks: tuple[TaskRecord, ...]
    #: Opaque; pass it back for the next page. ``None`` on the last page.
    next_cursor: str | None


class HeldTaskState(enum.StrEnum):
    """What a held task is doing, as a host's window shows it."""

    IDLE = "idle"
    #: A prompt's run or a goal cycle is going.
    RUNNING = "running"
    #: A run is going and waits for a permission answer.
    ASKING = "asking"
    #: The lease was revoked; its cleanup has not ended yet.
    REVOKED = "revoked"


@attrs.frozen(kw_only=True)
class HeldTask:
    """A task some caller (an ACP session, a host window) holds a lease on."""

    #: The task row as its lease last saw it.
    task: TaskRecord
    #: The id of the session mode it is in.
    mode: str
    state: HeldTaskState
