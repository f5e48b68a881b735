"""Opening a lease: on a new task, on a stored one (an attach), or on a fork of one. Every
check runs before the lease exists; the one place a lease is made and registered is here."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Mapping, Sequence

import trio

from maple_acp.model import GoalRecord, ItemKind, TaskPolicy, TaskRecord, TaskSurface
from maple_acp.runtime._account_tasks import AccountTasks
from maple_acp.runtime._admission import (
    AdmissionFence,
    ProjectRoots,
    check_attachable,
    check_directories,
)
from maple_acp.runtime._context import LeaseContext
from maple_acp.runtime._errors import CHILD_SESSION_MESSAGE, RejectionKind, RuntimeRejection
from maple_acp.runtime._lease import SessionLease
from maple_acp.runtime._lease_life import RouterFactory
from maple_acp.runtime._models import AccountModels
from maple_acp.runtime._registry import LeaseRegistry
from maple_acp.runtime._relay import RelayValues, validate_relay_values
from maple_acp.runtime._sweep import ProvisionalSweep
from maple_acp.runtime._tools import ToolContext
from maple_acp.store import ForkSourceMissing, TaskStore


class LeaseOpener:
    """Opens leases for one service. The service's public methods (``serve_new_task``,
    ``serve_task``, ``fork_task``, ``check_root``) say the rules and the refusals; this holds
    how they are checked, in their order, with what the service hands it: the store, the
    fence, the project roots, the account's models, the tasks, the sweep and the registry."""

    def __init__(
        self,
        *,
        store: TaskStore,
        fence: AdmissionFence,
        roots: ProjectRoots,
        models: AccountModels,
        tasks: AccountTasks,
        sweep: ProvisionalSweep,
        leases: LeaseRegistry,
        lease_context: LeaseContext,
        installation_id: str,
        relay_allow_list: frozenset[str],
        tool_env_allow: Collection[str],
        now_ms: Callable[[], int],
    ) -> None:
        self._store = store
        self._fence = fence
        self._roots = roots
        self._models = models
        self._tasks = tasks
        self._sweep = sweep
        self._leases = leases
        self._lease_context = lease_context
        self._installation_id = installation_id
        self._relay_allow_list = relay_allow_list
        self._tool_env_allow = tool_env_allow
        self._now_ms = now_ms

    def _tool_context(self, relay: Mapping[str, str] | None) -> ToolContext:
        if isinstance(relay, RelayValues):
            # Checked by accept_relay; the allow-list cannot have changed since.
            return ToolContext(relay, env_allow=self._tool_env_allow)
        checked = validate_relay_values(relay or {}, self._relay_allow_list)
        return ToolContext(checked, env_allow=self._tool_env_allow)

    async def _holds_user_message(self, task: TaskRecord) -> bool:
        """Whether a provisional task's history holds a user message (only a fork's can: a
        durable task's model lock is its first admitted message)."""
        if not task.provisional:
            return False
        items = await self._store.history(task.id)
        return any(item.kind is ItemKind.USER for item in items)

    def _open_lease(
        self,
        task: TaskRecord,
        generation: int,
        *,
        created_here: bool,
        tools: ToolContext,
        goal: GoalRecord | None,
        history_locked: bool = False,
    ) -> SessionLease:
        """The one place a lease is made and registered. ``history_locked``: the task is
        provisional but its history holds a user message (a fork's copy of a prompted
        session), so its model is locked as its source's is."""
        lease = SessionLease(
            self._lease_context,
            task=task,
            generation=generation,
            installation_id=self._installation_id,
            created_here=created_here,
            tools=tools,
            goal=goal,
            history_locked=history_locked,
        )
        self._leases.add(lease)
        return lease

    async def serve_new_task(
        self,
        cwd: str,
        *,
        relay: Mapping[str, str] | None,
        router_factory: RouterFactory | None,
        model: str | None,
        surface: TaskSurface,
        allowed_roots: Sequence[str],
        additional_directories: Sequence[str],
        task_status: trio.TaskStatus[SessionLease],
    ) -> None:
        generation = self._fence.admit()
        tools = self._tool_context(relay)
        root = await self._roots.admit(cwd, allowed_roots)
        additional = await self._roots.admit_additional(additional_directories, allowed_roots)
        if model is None:
            model = self._models.cached().default
        elif model not in await self._models.choices(generation, False):
            raise RuntimeRejection(RejectionKind.UNKNOWN_MODEL, "the model is not in the catalog")
        account = self._fence.account_of(generation)
        now = self._now_ms()
        record = TaskRecord(
            id=uuid.uuid4().hex,
            account=account,
            root=root,
            created_ms=now,
            updated_ms=now,
            policy=TaskPolicy.CALLER_MEDIATED,
            surface=surface,
            model=model,
            provisional=surface is TaskSurface.EXTERNAL,
            additional_directories=additional,
        )
        await self._store.create_task(record)
        lease = self._open_lease(record, generation, created_here=True, tools=tools, goal=None)
        # serve() cleans up (and deletes the untouched row) if the lease is never handed out.
        await lease.serve(router_factory, task_status=task_status)

    async def serve_task(
        self,
        task_id: str,
        cwd: str,
        *,
        relay: Mapping[str, str] | None,
        router_factory: RouterFactory | None,
        allowed_roots: Sequence[str],
        additional_directories: Sequence[str],
        replace_directories: bool,
        task_status: trio.TaskStatus[SessionLease],
    ) -> None:
        generation = self._fence.admit()
        tools = self._tool_context(relay)
        root = await self._roots.admit(cwd, allowed_roots)
        additional = await self._roots.admit_additional(additional_directories, allowed_roots)
        store = self._store
        async with self._sweep.lock:
            found = await store.get_task(task_id)
            self._sweep.check_found(task_id, found)
            account = self._fence.account_of(generation)
            if found is not None and found.account == account:
                _refuse_child(found)
            named = additional
            if replace_directories and found is not None:
                named = found.additional_directories
            task = check_attachable(found, account=account, root=root, additional=named)
            self._leases.reserve(task_id)
            try:
                if task.provisional and task.provisional_expires_ms is not None:
                    # Held now: the grace sweep must not take it.
                    task = await store.set_provisional_expiry(task_id, None) or task
            except BaseException:
                self._leases.unreserve(task_id)
                raise
        try:
            if task.model is not None:
                choices = await self._models.choices(generation, False)
                if task.model not in choices:
                    raise RuntimeRejection(
                        RejectionKind.MODEL_RETIRED, "the session's model is no longer offered"
                    )
            goal = await store.get_goal(task_id)
            history_locked = await self._holds_user_message(task)
            if frozenset(additional) != frozenset(task.additional_directories):
                task = await store.set_task_directories(task_id, additional) or task
            self._fence.check(generation)
        except BaseException:
            tools.revoke()
            with trio.CancelScope(shield=True):
                expiry = found.provisional_expires_ms if found is not None else None
                if task.provisional and expiry is not None:
                    await store.set_provisional_expiry(task_id, expiry)
            self._leases.unreserve(task_id)
            raise
        lease = self._open_lease(
            task,
            generation,
            created_here=False,
            tools=tools,
            goal=goal,
            history_locked=history_locked,
        )
        await lease.serve(router_factory, task_status=task_status)

    async def fork_task(
        self,
        task_id: str,
        *,
        cwd: str,
        up_to: str | None,
        relay: Mapping[str, str] | None,
        router_factory: RouterFactory | None,
        allowed_roots: Sequence[str],
        additional_directories: Sequence[str] | None,
        task_status: trio.TaskStatus[SessionLease],
    ) -> None:
        generation = self._fence.admit()
        tools = self._tool_context(relay)
        root = await self._roots.admit(cwd, allowed_roots)
        source = await self._tasks.own(generation, task_id)
        _refuse_child(source)
        named = source.additional_directories
        additional = await self._roots.admit_additional(
            named if additional_directories is None else additional_directories, allowed_roots
        )
        check_directories(source, root, additional)
        if source.policy is not TaskPolicy.CALLER_MEDIATED:
            raise RuntimeRejection(RejectionKind.WRONG_POLICY, "the session is not the caller's")
        now = self._now_ms()
        record = TaskRecord(
            id=uuid.uuid4().hex,
            account=source.account,
            root=source.root,
            created_ms=now,
            updated_ms=now,
            policy=TaskPolicy.CALLER_MEDIATED,
            surface=TaskSurface.EXTERNAL,
            model=source.model,
            provisional=True,
            mode=source.mode,
            thought_level=source.thought_level,
            additional_directories=source.additional_directories,
            boolean_options=source.boolean_options,
        )
        # Checked right before the copy with no await between, and the store runs its work
        # one call at a time in arrival order: a run that starts after this check writes its
        # journal after the copy, so the fork holds whole turns only.
        self._leases.check_idle(task_id)
        try:
            await self._store.fork_task(task_id, record, up_to=up_to)
        except ForkSourceMissing as exc:
            if exc.message:
                raise RuntimeRejection(
                    RejectionKind.UNKNOWN_MESSAGE, "the session has no such message"
                ) from None
            raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "no such session") from None
        # Shielded: a cancellation between the copy and the lease would strand the copy (no
        # lease to settle its grace period).
        with trio.CancelScope(shield=True):
            history_locked = await self._holds_user_message(record)
        lease = self._open_lease(
            record,
            generation,
            created_here=True,
            tools=tools,
            goal=None,
            history_locked=history_locked,
        )
        # serve() cleans up (and deletes the untouched row) if the lease is never handed out.
        await lease.serve(router_factory, task_status=task_status)

    async def check_root(
        self,
        lease: SessionLease,
        cwd: str,
        *,
        allowed_roots: Sequence[str],
        additional_directories: Sequence[str],
        replace_directories: bool,
    ) -> tuple[str, ...]:
        root = await self._roots.admit(cwd, allowed_roots)
        additional = await self._roots.admit_additional(additional_directories, allowed_roots)
        check_directories(
            lease.task,
            root,
            lease.task.additional_directories if replace_directories else additional,
        )
        return additional


def _refuse_child(task: TaskRecord | None) -> None:
    """A child session is opened only through its parent (``CHILD_SESSION``)."""
    if task is not None and task.parent_id is not None:
        raise RuntimeRejection(RejectionKind.CHILD_SESSION, CHILD_SESSION_MESSAGE)
