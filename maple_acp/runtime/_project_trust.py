"""Project-trust decisions as the service takes them: one account's decision per project,
refused while a session of that project could be reading its skills."""

from __future__ import annotations

from collections.abc import Callable

from maple_acp.runtime._admission import AdmissionFence, canonical_directory
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._registry import LeaseRegistry
from maple_acp.store import TaskStore


class ProjectTrust:
    """Reads and saves the signed-in account's trust decisions. A decision is ``TRUST_BUSY``
    while a task of the project runs, or, when a host asks (not a lease of the project), while
    one is leased at all."""

    def __init__(
        self,
        *,
        store: TaskStore,
        fence: AdmissionFence,
        leases: LeaseRegistry,
        now_ms: Callable[[], int],
    ) -> None:
        self._store = store
        self._fence = fence
        self._leases = leases
        self._now_ms = now_ms

    async def decision(self, cwd: str) -> bool | None:
        generation = self._fence.admit()
        root = await canonical_directory(cwd)
        account = self._fence.account_of(generation)
        return await self._store.get_trust(account, root)

    async def decide(self, cwd: str, trusted: bool | None) -> None:
        generation = self._fence.admit()
        root = await canonical_directory(cwd)
        await self.save(generation, root, trusted, from_lease=False)

    async def save(
        self,
        generation: int,
        root: str,
        trusted: bool | None,
        *,
        from_lease: bool,
    ) -> None:
        """Save the decision unless a task of the project is running, or, when a host asks
        (not a lease), leased at all."""
        account = self._fence.account_of(generation)
        for lease in self._leases.leases():
            if lease.task.root != root:
                continue
            if lease.active_run is not None or (not from_lease and not lease.revoked):
                raise RuntimeRejection(
                    RejectionKind.TRUST_BUSY, "a session of this project is running or in use"
                )
        await self._store.set_trust(account, root, trusted, now_ms=self._now_ms())
        self._fence.check(generation)
