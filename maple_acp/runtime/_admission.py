"""What may enter the runtime: the account and shutdown fence, and the project-directory rule
(canonical, accessible, inside the allowed roots). Each rule is enforced here and nowhere else;
callers translate the ``RuntimeRejection`` they get."""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from typing import Final

from maple_acp.model import TaskPolicy, TaskRecord
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._threads import in_worker_thread

#: Directories a session may name besides its working directory: each one is admitted, stored
#: with the task and looked at on every file-tool call, so the set stays small.
MAX_ADDITIONAL_DIRECTORIES: Final = 16

_CWD: Final = "the working directory"
_ADDITIONAL: Final = "an additional directory"


def _reject(message: str) -> RuntimeRejection:
    return RuntimeRejection(RejectionKind.INVALID_CWD, message)


def _check_absolute(path: str, what: str) -> None:
    if not isinstance(path, str) or not path or "\x00" in path:
        raise _reject(f"{what} must be a non-empty path")
    if not os.path.isabs(path):
        raise _reject(f"{what} must be an absolute path")


def _canonical_directory_sync(path: str, what: str = _CWD) -> str:
    _check_absolute(path, what)
    try:
        canonical = os.path.realpath(path, strict=True)
    except OSError as exc:
        raise _reject(f"{what} does not exist or is not accessible") from exc
    if not os.path.isdir(canonical):
        raise _reject(f"{what} is not a directory")
    if not os.access(canonical, os.R_OK | os.X_OK):
        raise _reject(f"{what} is not accessible")
    return canonical


async def canonical_directory(path: str, what: str = _CWD) -> str:
    """The canonical form of an absolute, accessible directory (symlinks resolved). Raises
    ``RuntimeRejection(INVALID_CWD)``; ``what`` names the directory in its message."""
    return await in_worker_thread(_canonical_directory_sync, path, what)


def _existing_directory_sync(path: str) -> str | None:
    _check_absolute(path, _CWD)
    try:
        return _canonical_directory_sync(path)
    except RuntimeRejection:
        return None


async def existing_directory(path: str) -> str | None:
    """The canonical form of the absolute directory ``path``, ``None`` when no accessible
    directory is there (a filter naming it matches nothing). Raises ``INVALID_CWD`` only for
    a path that is not absolute."""
    return await in_worker_thread(_existing_directory_sync, path)


def within_roots(root: str, allowed_roots: Sequence[str]) -> bool:
    """Whether the canonical directory ``root`` is one of ``allowed_roots`` or below one
    (canonical too); an empty policy admits every directory. Admission policy, not a sandbox."""
    if not allowed_roots:
        return True
    return any(
        root == allowed or root.startswith(allowed.rstrip(os.sep) + os.sep)
        for allowed in allowed_roots
    )


class AdmissionFence:
    """The account and shutdown fence: each sign-in of a different account (and each
    sign-out) starts a new generation, and work captured under an older one is refused."""

    def __init__(self) -> None:
        self.account: str | None = None
        self.generation = 0
        self.ready = False
        self.draining = False

    def new_generation(self, account: str | None) -> None:
        self.generation += 1
        self.account = account

    def admits(self, generation: int) -> bool:
        return (
            self.ready
            and not self.draining
            and self.account is not None
            and generation == self.generation
        )

    def admit(self, generation: int | None = None) -> int:
        """The current generation, if work may be admitted under ``generation`` (default: the
        current one). Raises ``SHUTTING_DOWN``, ``ACCOUNT_CHANGED`` or ``NOT_SIGNED_IN``."""
        if self.draining or not self.ready:
            raise RuntimeRejection(RejectionKind.SHUTTING_DOWN, "the agent runtime is not serving")
        if generation is not None and generation != self.generation:
            raise RuntimeRejection(
                RejectionKind.ACCOUNT_CHANGED, "the account changed since the operation began"
            )
        if self.account is None:
            raise RuntimeRejection(RejectionKind.NOT_SIGNED_IN, "no account is signed in")
        return self.generation

    def check(self, generation: int) -> None:
        self.admit(generation)

    def account_of(self, generation: int) -> str:
        """The signed-in account, if work may still be admitted under ``generation``."""
        self.admit(generation)
        assert self.account is not None
        return self.account


class ProjectRoots:
    """The allowed-roots policy over canonical project directories (empty: any directory)."""

    def __init__(self, allowed: Sequence[str]) -> None:
        self._allowed = tuple(allowed)

    async def canonicalise_policy(self) -> None:
        """Resolve the configured roots once, when the service starts serving."""
        self._allowed = tuple([await canonical_directory(root) for root in self._allowed])

    def admits(self, root: str, caller_roots: Sequence[str] = ()) -> bool:
        return within_roots(root, self._allowed) and within_roots(root, caller_roots)

    async def admit(self, cwd: str, caller_roots: Sequence[str] = ()) -> str:
        """``cwd`` canonicalised once, if it is an accessible directory inside the allowed
        roots (the service's, and the calling surface's own canonical ``caller_roots``).
        Raises ``INVALID_CWD``."""
        return await self._admit(cwd, caller_roots, _CWD)

    async def admit_filter(self, cwd: str, caller_roots: Sequence[str] = ()) -> str | None:
        """A list filter's ``cwd`` canonicalised, ``None`` when no directory is there (it
        matches no session); an existing one must be inside the allowed roots, as for
        ``admit``. Raises ``INVALID_CWD``."""
        root = await existing_directory(cwd)
        if root is not None:
            self._check_within(root, caller_roots, _CWD)
        return root

    def _check_within(self, root: str, caller_roots: Sequence[str], what: str) -> None:
        if not self.admits(root, caller_roots):
            raise _reject(f"{what} is outside the allowed roots")

    async def _admit(self, path: str, caller_roots: Sequence[str], what: str) -> str:
        root = await canonical_directory(path, what)
        self._check_within(root, caller_roots, what)
        return root

    async def admit_additional(
        self, directories: Sequence[str], caller_roots: Sequence[str] = ()
    ) -> tuple[str, ...]:
        """A session's additional directories, each canonicalised and admitted like the working
        directory, in the order given, a repeat named once. Raises ``INVALID_CWD`` (also for
        more than ``MAX_ADDITIONAL_DIRECTORIES``)."""
        if isinstance(directories, str) or len(directories) > MAX_ADDITIONAL_DIRECTORIES:
            raise RuntimeRejection(
                RejectionKind.INVALID_CWD,
                f"a session names at most {MAX_ADDITIONAL_DIRECTORIES} additional directories",
            )
        admitted: dict[str, None] = {}
        for directory in directories:
            admitted[await self._admit(directory, caller_roots, _ADDITIONAL)] = None
        return tuple(admitted)


def check_directories(task: TaskRecord, root: str, additional: Collection[str]) -> None:
    """A caller attaching to ``task`` names its root and the same set of additional directories
    (in any order; all canonical). Raises ``ROOT_MISMATCH``."""
    if task.root != root:
        raise RuntimeRejection(
            RejectionKind.ROOT_MISMATCH, "the working directory is not the session's project root"
        )
    if frozenset(additional) != frozenset(task.additional_directories):
        raise RuntimeRejection(
            RejectionKind.ROOT_MISMATCH,
            "the additional directories are not the ones the session was created with",
        )


def check_attachable(
    task: TaskRecord | None, *, account: str, root: str, additional: Collection[str] = ()
) -> TaskRecord:
    """``task`` if a caller of ``account`` in ``root`` (with ``additional`` directories) may
    attach to it."""
    if task is None:
        raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "no such session")
    if task.account != account:
        raise RuntimeRejection(RejectionKind.WRONG_ACCOUNT, "no such session")
    check_directories(task, root, additional)
    if task.policy is not TaskPolicy.CALLER_MEDIATED:
        raise RuntimeRejection(
            RejectionKind.WRONG_POLICY, "the session is not in the caller-mediated mode"
        )
    return task
