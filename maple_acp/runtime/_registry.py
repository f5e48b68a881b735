"""Which lease holds which task: at most one per task, counting a lease still cleaning up and
an attach still being set up."""

from __future__ import annotations

from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._lease import SessionLease


class LeaseRegistry:
    def __init__(self) -> None:
        self._leases: dict[str, SessionLease] = {}
        self._reserved: set[str] = set()

    def __len__(self) -> int:
        return len(self._leases)

    def of(self, task_id: str) -> SessionLease | None:
        return self._leases.get(task_id)

    def leases(self) -> list[SessionLease]:
        return list(self._leases.values())

    def check_idle(self, task_id: str) -> None:
        """Raises ``RUN_ACTIVE`` if the task's holder runs something (a prompt or a goal
        cycle), or a prompt holds its slot (a prompt admitted whose run has not started yet,
        during its trust question, say): the one place that rule is checked."""
        holder = self._leases.get(task_id)
        if holder is not None and holder.busy:
            raise RuntimeRejection(RejectionKind.RUN_ACTIVE, "the session has a run going")

    def check_free(self, task_id: str) -> None:
        """Raises ``RUN_ACTIVE`` if the task's holder runs something, ``TASK_LEASED`` if any
        lease holds (or is being set up on) it."""
        self.check_idle(task_id)
        holder = self._leases.get(task_id)
        if holder is not None or task_id in self._reserved:
            raise RuntimeRejection(RejectionKind.TASK_LEASED, "the session is open elsewhere")

    def reserve(self, task_id: str) -> None:
        """Hold ``task_id`` for a lease being set up (``check_free`` first); the lease's
        ``add`` or an ``unreserve`` ends the hold."""
        self.check_free(task_id)
        self._reserved.add(task_id)

    def unreserve(self, task_id: str) -> None:
        self._reserved.discard(task_id)

    def add(self, lease: SessionLease) -> None:
        assert lease.task_id not in self._leases
        self._reserved.discard(lease.task_id)
        self._leases[lease.task_id] = lease

    def remove(self, task_id: str, lease: object) -> None:
        """Forget ``task_id``'s lease if it is still ``lease`` (a newer one stays)."""
        if self._leases.get(task_id) is lease:
            del self._leases[task_id]
