"""What one lease knows of its project's trust: the skills its backend sees, and the scan a
decision still to come will reuse."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from maple_acp.runtime._lease_life import LeaseGuard
from maple_acp.runtime._trust import ProjectSkills, SkillInfo, TrustStatus


class LeaseSkills:
    """The project skills of one leased task. Unknown until asked: a task reads its project's
    trust before its first run, not when it is opened (clients open many sessions they never
    prompt).

    Hooks: ``saved_trust`` (the account's saved decision for the project) and ``save_trust``
    (store a decision from inside the lease: the service's rule for when it may)."""

    def __init__(
        self,
        *,
        root: str,
        guard: LeaseGuard,
        saved_trust: Callable[[], Awaitable[bool | None]],
        save_trust: Callable[[bool], Awaitable[None]],
    ) -> None:
        self._root = root
        self._guard = guard
        self._saved_trust = saved_trust
        self._save_trust = save_trust
        self._skills: tuple[SkillInfo, ...] | None = None
        #: The scan ``status`` made for a decision still to come: the decision reuses it
        #: instead of scanning the project a second time.
        self._undecided: ProjectSkills | None = None

    @property
    def visible(self) -> tuple[SkillInfo, ...]:
        """Project skills the backend sees: empty unless the project is trusted."""
        return self._skills or ()

    async def status(self) -> TrustStatus:
        with self._guard.operation():
            trusted = await self._saved_trust()
            project = await ProjectSkills.scan(self._root, trusted, count_untrusted=True)
            self._guard.check_live()
            self._skills = project.visible
            self._undecided = project if trusted is None else None
            return TrustStatus(root=self._root, trusted=trusted, has_skills=bool(project.found))

    async def decide(self, trusted: bool) -> None:
        with self._guard.operation():
            await self._save_trust(trusted)
            scanned, self._undecided = self._undecided, None
            if scanned is None:
                await self._load()
            else:
                self._skills = scanned.decided(trusted).visible

    async def rebuild(self) -> tuple[SkillInfo, ...]:
        with self._guard.operation():
            return await self._load()

    async def known(self) -> None:
        """Read the skills once per lease, before its first turn, if nothing read them yet."""
        if self._skills is None:
            await self._load()

    async def _load(self) -> tuple[SkillInfo, ...]:
        trusted = await self._saved_trust()
        project = await ProjectSkills.scan(self._root, trusted, count_untrusted=False)
        self._guard.check_live()
        self._skills = project.visible
        return project.visible
