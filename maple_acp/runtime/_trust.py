"""Project trust: finding a project's real skill files without following a symlink, and the
one rule for what a backend sees of them (:class:`ProjectSkills`: only a trusted project's)."""

from __future__ import annotations

import os
import stat

import attrs

from maple_acp.runtime._threads import in_worker_thread

#: Where project-provided skills live, relative to the project root.
SKILLS_DIR = (".agents", "skills")
SKILL_FILE = "SKILL.md"
#: A project's skill tree is untrusted input; the walk stops after this many entries...
MAX_SKILL_SCAN_ENTRIES = 10_000
#: ...and below this depth under the skills directory.
MAX_SKILL_SCAN_DEPTH = 16


@attrs.frozen(kw_only=True)
class SkillInfo:
    """One project skill: its name (the directory path under the skills directory) and the
    absolute path of its ``SKILL.md``."""

    name: str
    path: str


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def find_project_skills(root: str) -> tuple[SkillInfo, ...]:
    """Every regular, non-symlinked ``SKILL.md`` under ``root/.agents/skills``, reached without
    following a symlinked directory at any level. Blocking; call it on a worker thread."""
    base = root
    for part in SKILLS_DIR:
        base = os.path.join(base, part)
        if not _is_real_dir(base):
            return ()
    found: list[SkillInfo] = []
    budget = MAX_SKILL_SCAN_ENTRIES
    stack: list[tuple[str, int]] = [(base, 0)]
    while stack and budget > 0:
        directory, depth = stack.pop()
        try:
            with os.scandir(directory) as entries:
                listing = sorted(entries, key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in listing:
            budget -= 1
            if budget <= 0:
                break
            try:
                if entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 < MAX_SKILL_SCAN_DEPTH:
                        stack.append((entry.path, depth + 1))
                elif entry.name == SKILL_FILE and entry.is_file(follow_symlinks=False):
                    name = os.path.relpath(directory, base)
                    found.append(SkillInfo(name=name, path=entry.path))
            except OSError:
                continue
    found.sort(key=lambda skill: skill.path)
    return tuple(found)


async def find_project_skills_async(root: str) -> tuple[SkillInfo, ...]:
    return await in_worker_thread(find_project_skills, root)


@attrs.frozen(kw_only=True)
class ProjectSkills:
    """A project's skill files as one scan found them, and the account's saved decision."""

    #: The saved decision; ``None`` when undecided.
    trusted: bool | None
    #: The real skill files found; empty when the scan was skipped (an untrusted project
    #: whose files nobody needed to count).
    found: tuple[SkillInfo, ...]

    @property
    def visible(self) -> tuple[SkillInfo, ...]:
        """What a backend may see: a trusted project's skills, else none."""
        return self.found if self.trusted else ()

    def decided(self, trusted: bool) -> ProjectSkills:
        """The same scan under a decision just made."""
        return attrs.evolve(self, trusted=trusted)

    @classmethod
    async def scan(cls, root: str, trusted: bool | None, *, count_untrusted: bool) -> ProjectSkills:
        """Scan ``root`` when its skills can be visible (or, with ``count_untrusted``, when
        the caller must know whether an undecided project has any)."""
        needed = trusted or count_untrusted
        found = await find_project_skills_async(root) if needed else ()
        return cls(trusted=trusted, found=found)


@attrs.frozen(kw_only=True)
class TrustStatus:
    """Whether a project-trust decision is needed before the task's first prompt."""

    root: str
    #: The saved decision; ``None`` when undecided.
    trusted: bool | None
    #: The project has real (non-symlinked) skill files.
    has_skills: bool

    @property
    def decision_needed(self) -> bool:
        return self.has_skills and self.trusted is None
