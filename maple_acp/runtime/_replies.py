"""What ``AgentService`` answers with: plain records, no behaviour."""

from __future__ import annotations

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
