"""``AgentService``: the transport-neutral runtime facade.

This module is the service's public face: every method a host or the edge calls on it
(opening, attaching, forking, listing and deleting tasks, models, trust, relay values,
status), each checking its rules and handing the work on. How a lease lives is in
``_lease`` and ``_lease_life``, admission in ``_admission``, the model cache in ``_models``.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Collection, Mapping, Sequence

import trio

from maple_acp._tool_env import check_tool_env_allow
from maple_acp.model import (
    GoalRecord,
    ItemKind,
    TaskPolicy,
    TaskQuery,
    TaskRecord,
    TaskSurface,
    TimelineItem,
)
from maple_acp.runtime._admission import (
    AdmissionFence,
    ProjectRoots,
    canonical_directory,
    check_attachable,
    check_directories,
)
from maple_acp.runtime._attachments import PromptCapabilities
from maple_acp.runtime._backend import (
    AgentBackend,
    backend_commands,
    backend_prompt_capabilities,
    backend_thought_levels,
)
from maple_acp.runtime._context import LeaseContext
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._history import replay_view
from maple_acp.runtime._lease import SessionLease
from maple_acp.runtime._lease_life import RouterFactory
from maple_acp.runtime._models import ModelCatalog, ModelCatalogCache, ModelChoices
from maple_acp.runtime._modes import BUILTIN_MODES, ModeSet
from maple_acp.runtime._offer import CommandBounds
from maple_acp.runtime._permissions import PermissionPolicy
from maple_acp.runtime._registry import LeaseRegistry
from maple_acp.runtime._relay import RelayValues, validate_relay_values
from maple_acp.runtime._replies import HeldTask, HeldTaskState, ServiceStatus, TaskListing
from maple_acp.runtime._self_serving import ServedInOwnNursery
from maple_acp.runtime._tools import ToolContext
from maple_acp.store import ForkSourceMissing, InvalidCursor, TaskStore

logger = logging.getLogger(__name__)

#: How long a provisional task released without a close stays loadable by id: clients split
#: "create" and "prompt" across processes.
DEFAULT_PROVISIONAL_GRACE_S = 600.0
#: The longest grace period accepted (ten years): its milliseconds must fit the store.
MAX_PROVISIONAL_GRACE_S = 10 * 365 * 24 * 3600.0
#: How often expired, untouched provisional tasks are swept.
PROVISIONAL_SWEEP_INTERVAL_S = 60.0
#: Swept never-prompted session ids remembered to say "expired" rather than "unknown": a
#: client comes back for a handful, and 1,024 ids are a few tens of KiB.
MAX_REMEMBERED_EXPIRED = 1024
#: ``drain`` waits this long for cancelled runs to end.
DRAIN_BOUND_S = 5.0
#: A task list page, at most.
MAX_LIST_PAGE = 100


class AgentService(ServedInOwnNursery):
    """The runtime facade. See the package docstring for a tour.

    Resource handling: ``serve`` (or ``async with service``) runs the start-up sweep of stranded
    provisional tasks, reports ready, then sweeps expired provisional tasks periodically until
    cancelled. The service does not own the store (the host closes it) nor the leases' tasks,
    which run in whatever nursery the caller starts ``serve_new_task``/``serve_task`` in.

    Error handling: refusals are ``RuntimeRejection`` with a ``RejectionKind``; store failures
    surface as ``maple_acp.store.StoreError``. A failing periodic sweep is logged and retried at
    the next interval.
    """

    def __init__(
        self,
        *,
        store: TaskStore,
        backend: AgentBackend,
        catalog: ModelCatalog,
        policy: PermissionPolicy,
        installation_id: str = "default",
        provisional_grace_s: float = DEFAULT_PROVISIONAL_GRACE_S,
        relay_allow_list: Collection[str] = (),
        allowed_roots: Sequence[str] = (),
        tool_env_allow: Collection[str] = (),
        modes: ModeSet = BUILTIN_MODES,
    ) -> None:
        if not isinstance(modes, ModeSet):
            raise ValueError("modes is a ModeSet")
        if provisional_grace_s < 0:
            raise ValueError("the provisional grace period cannot be negative")
        if not math.isfinite(provisional_grace_s) or provisional_grace_s > MAX_PROVISIONAL_GRACE_S:
            raise ValueError(
                f"the provisional grace period must be finite, at most {MAX_PROVISIONAL_GRACE_S} s"
            )
        self.store = store
        self.backend = backend
        self.policy = policy
        self.installation_id = installation_id
        self.provisional_grace_ms = int(provisional_grace_s * 1000)
        self.relay_allow_list = frozenset(relay_allow_list)
        #: Host variables tool children inherit beyond the built-in list (``ValueError`` for a
        #: bad name or a ``MAPLE_ACP_*`` one).
        self.tool_env_allow = frozenset(check_tool_env_allow(tool_env_allow))
        #: The session modes offered (the built-in four unless the host declared its own).
        self.modes = modes
        self._roots = ProjectRoots(allowed_roots)
        self._models = ModelCatalogCache(catalog)
        self._fence = AdmissionFence()
        self._leases = LeaseRegistry()
        self._command_bounds = CommandBounds()
        self._sweep_lock = trio.Lock()
        #: Never-prompted tasks the sweeps deleted, oldest first (see ``_remember_expired``).
        self._expired: dict[str, None] = {}
        self._wall_anchor_ms = 0
        self._trio_anchor = 0.0
        self._lease_context = LeaseContext(
            store=store,
            backend=backend,
            policy=policy,
            now_ms=self.now_ms,
            provisional_grace_ms=self.provisional_grace_ms,
            check_admitted=self._fence.check,
            admits=self._fence.admits,
            model_choices=self._model_choices,
            known_models=self._known_models,
            set_trust=lambda generation, root, trusted: self._set_trust(
                generation, root, trusted, from_lease=True
            ),
            unregister=self._leases.remove,
            declared_commands=lambda: self._command_bounds.of(backend_commands(backend)),
            modes=modes,
            thought_levels=lambda model: backend_thought_levels(backend, model),
        )

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def prompt_capabilities(self) -> PromptCapabilities:
        """What the backend takes in a prompt besides text and resource links."""
        return backend_prompt_capabilities(self.backend)

    def now_ms(self) -> int:
        """Unix milliseconds, advanced by trio's clock from the moment ``serve`` started (so a
        test's mock clock moves the runtime's timestamps and grace periods)."""
        return self._wall_anchor_ms + int((trio.current_time() - self._trio_anchor) * 1000)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep stranded provisional tasks, report ready, then sweep expired ones every
        ``PROVISIONAL_SWEEP_INTERVAL_S`` until cancelled."""
        self._wall_anchor_ms = time.time_ns() // 1_000_000
        self._trio_anchor = trio.current_time()
        await self._roots.canonicalise_policy()
        deleted = await self.store.sweep_provisional(now_ms=self.now_ms(), stranded=True)
        if deleted:
            logger.info("start-up sweep deleted %d stranded provisional tasks", len(deleted))
            self._remember_expired(deleted)
        self._fence.ready = True
        task_status.started()
        try:
            while True:
                await trio.sleep(PROVISIONAL_SWEEP_INTERVAL_S)
                try:
                    await self.sweep_provisional()
                except Exception:
                    logger.warning("provisional sweep failed", exc_info=True)
        finally:
            self._fence.ready = False

    def sign_in(self, account: str) -> int:
        """Make ``account`` the active one. A different account starts a new generation:
        every lease of the previous one is revoked and operations captured before are rejected.
        Returns the generation."""
        if not account:
            raise ValueError("an account id must be non-empty")
        if account != self._fence.account:
            self._new_generation(account, "the account changed")
        return self._fence.generation

    def sign_out(self) -> None:
        """Revoke every lease and reject every operation captured before."""
        if self._fence.account is not None:
            self._new_generation(None, "the account signed out")

    def _new_generation(self, account: str | None, reason: str) -> None:
        self._fence.new_generation(account)
        for lease in self._leases.leases():
            lease.revoke(reason)

    @property
    def account(self) -> str | None:
        return self._fence.account

    @property
    def generation(self) -> int:
        return self._fence.generation

    async def drain(self) -> bool:
        """Stop admitting work (every later operation is ``SHUTTING_DOWN``), cancel every
        active run, and wait up to ``DRAIN_BOUND_S`` for them to end. True if they all did."""
        self._fence.draining = True
        for lease in self._leases.leases():
            lease.cancel_run()
        with trio.move_on_after(DRAIN_BOUND_S):
            for lease in self._leases.leases():
                run = lease.active_run
                if run is not None:
                    await run.wait()
            return True
        return False

    def status(self) -> ServiceStatus:
        leases = self._leases.leases()
        return ServiceStatus(
            ready=self._fence.ready,
            account=self._fence.account,
            generation=self._fence.generation,
            draining=self._fence.draining,
            leases=len(leases),
            active_runs=sum(1 for lease in leases if lease.active_run),
        )

    def held_tasks(self) -> tuple[HeldTask, ...]:
        """Every task a lease holds now (revoked ones still cleaning up included), in the order
        the leases were made: for a host's own window. Synchronous; reads no store."""
        return tuple(_held(lease) for lease in self._leases.leases())

    def lease_of(self, task_id: str) -> SessionLease | None:
        """The lease holding ``task_id`` (revoked ones still cleaning up included)."""
        return self._leases.of(task_id)

    # -- models ------------------------------------------------------------------------------

    async def model_choices(self, *, refresh: bool = False) -> ModelChoices:
        """The chat models offered to the signed-in account, host default first. Reuses a
        recent listing unless ``refresh``; a listing takes at most 30 s, and when it fails or
        times out the previous listing (or only the default) is offered with
        ``refreshed=False``. ``ACCOUNT_CHANGED`` if the account changed meanwhile."""
        return await self._model_choices(self._fence.admit(), refresh)

    def cached_model_choices(self) -> ModelChoices:
        """The last listing for this account, or only the host default: never waits."""
        generation = self._fence.admit()
        account = self._fence.account_of(generation)
        cached = self._models.cached(account, generation)
        return cached if cached is not None else self._models.default_choices(account)

    def _known_models(self, generation: int) -> ModelChoices | None:
        if not self._fence.admits(generation):
            return None
        cached = self._models.cached(self._fence.account_of(generation), generation)
        return cached if cached is not None and cached.refreshed else None

    async def _model_choices(self, generation: int, refresh: bool) -> ModelChoices:
        account = self._fence.account_of(generation)
        return await self._models.choices(
            account, generation, lambda: self._fence.generation, refresh=refresh
        )

    # -- leases ------------------------------------------------------------------------------

    def accept_relay(self, offered: Mapping[str, str]) -> RelayValues:
        """Check relay values a connector offers, once: names the host does not allow are
        left out (``RelayValues.dropped`` counts them), the rest must meet the limits.
        ``INVALID_RELAY`` otherwise; the message names a variable, never a value. Pass the
        result as ``relay=`` to ``serve_new_task``/``serve_task``."""
        return RelayValues.accept(offered, self.relay_allow_list)

    def _tool_context(self, relay: Mapping[str, str] | None) -> ToolContext:
        if isinstance(relay, RelayValues):
            # Checked by accept_relay; the allow-list cannot have changed since.
            return ToolContext(relay, env_allow=self.tool_env_allow)
        checked = validate_relay_values(relay or {}, self.relay_allow_list)
        return ToolContext(checked, env_allow=self.tool_env_allow)

    async def _holds_user_message(self, task: TaskRecord) -> bool:
        """Whether a provisional task's history holds a user message (only a fork's can: a
        durable task's model lock is its first admitted message)."""
        if not task.provisional:
            return False
        items = await self.store.history(task.id)
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
            installation_id=self.installation_id,
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
        relay: Mapping[str, str] | None = None,
        router_factory: RouterFactory | None = None,
        model: str | None = None,
        surface: TaskSurface = TaskSurface.EXTERNAL,
        allowed_roots: Sequence[str] = (),
        additional_directories: Sequence[str] = (),
        task_status: trio.TaskStatus[SessionLease] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Create a task in ``cwd`` and hold a lease on it until the lease is released:
        ``lease = await nursery.start(service.serve_new_task, cwd, ...)``.

        The task is provisional (hidden from lists) for an external surface until its first
        admitted message. Its model is ``model`` or the catalog's default (taken from the
        cached listing: creating a task never waits for the catalog unless ``model`` is
        given). ``router_factory`` runs inside the lease's nursery before the lease is
        returned. ``allowed_roots`` are the calling surface's own (canonical) roots, applied
        with the service's. ``additional_directories`` (at most ``MAX_ADDITIONAL_DIRECTORIES``)
        are admitted like ``cwd`` and stored with the task: its backend sees them in
        ``turn.roots`` and its file tools reach inside them. Raises ``INVALID_CWD``,
        ``INVALID_RELAY``, ``UNKNOWN_MODEL`` and the admission kinds before anything is created.
        """
        generation = self._fence.admit()
        tools = self._tool_context(relay)
        root = await self._roots.admit(cwd, allowed_roots)
        additional = await self._roots.admit_additional(additional_directories, allowed_roots)
        if model is None:
            model = self.cached_model_choices().default
        elif model not in await self._model_choices(generation, False):
            raise RuntimeRejection(RejectionKind.UNKNOWN_MODEL, "the model is not in the catalog")
        account = self._fence.account_of(generation)
        now = self.now_ms()
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
        await self.store.create_task(record)
        lease = self._open_lease(record, generation, created_here=True, tools=tools, goal=None)
        # serve() cleans up (and deletes the untouched row) if the lease is never handed out.
        await lease.serve(router_factory, task_status=task_status)

    async def serve_task(
        self,
        task_id: str,
        cwd: str,
        *,
        relay: Mapping[str, str] | None = None,
        router_factory: RouterFactory | None = None,
        allowed_roots: Sequence[str] = (),
        additional_directories: Sequence[str] = (),
        replace_directories: bool = False,
        task_status: trio.TaskStatus[SessionLease] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Attach a lease to an existing task and hold it until released:
        ``lease = await nursery.start(service.serve_task, task_id, cwd, ...)``.

        ``additional_directories`` must be the task's set (in any order), unless
        ``replace_directories`` (a resume names the session's new set, each admitted like
        ``cwd``): then they are stored with the task once every check below has passed.
        Refusals, checked in this order, each before the lease exists: ``INVALID_CWD``,
        ``INVALID_RELAY``, ``TASK_NOT_FOUND``, ``WRONG_ACCOUNT``, ``ROOT_MISMATCH`` (``cwd``
        is not the task's canonical root, or the directories are not the task's set),
        ``WRONG_POLICY`` (not caller-mediated),
        ``RUN_ACTIVE``, ``TASK_LEASED``, ``MODEL_RETIRED`` (the persisted model left the
        catalog; never substituted), and the admission kinds. ``router_factory`` runs inside
        the lease's nursery after the checks and before the lease is returned; if it raises,
        the lease is cleaned up and its exception propagates.
        """
        generation = self._fence.admit()
        tools = self._tool_context(relay)
        root = await self._roots.admit(cwd, allowed_roots)
        additional = await self._roots.admit_additional(additional_directories, allowed_roots)
        async with self._sweep_lock:
            found = await self.store.get_task(task_id)
            if found is None and task_id in self._expired:
                raise self._expired_rejection(task_id)
            account = self._fence.account_of(generation)
            named = additional
            if replace_directories and found is not None:
                named = found.additional_directories
            task = check_attachable(found, account=account, root=root, additional=named)
            self._leases.reserve(task_id)
            try:
                if task.provisional and task.provisional_expires_ms is not None:
                    # Held now: the grace sweep must not take it.
                    task = await self.store.set_provisional_expiry(task_id, None) or task
            except BaseException:
                self._leases.unreserve(task_id)
                raise
        try:
            if task.model is not None:
                choices = await self._model_choices(generation, False)
                if task.model not in choices:
                    raise RuntimeRejection(
                        RejectionKind.MODEL_RETIRED, "the session's model is no longer offered"
                    )
            goal = await self.store.get_goal(task_id)
            history_locked = await self._holds_user_message(task)
            if frozenset(additional) != frozenset(task.additional_directories):
                task = await self.store.set_task_directories(task_id, additional) or task
            self._fence.check(generation)
        except BaseException:
            tools.revoke()
            with trio.CancelScope(shield=True):
                expiry = found.provisional_expires_ms if found is not None else None
                if task.provisional and expiry is not None:
                    await self.store.set_provisional_expiry(task_id, expiry)
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
        up_to: str | None = None,
        relay: Mapping[str, str] | None = None,
        router_factory: RouterFactory | None = None,
        allowed_roots: Sequence[str] = (),
        additional_directories: Sequence[str] | None = None,
        task_status: trio.TaskStatus[SessionLease] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Create a task with a copy of ``task_id``'s history (all of it, or up to and
        including the message ``up_to``) and hold a lease on it until released, like
        ``serve_new_task``: ``lease = await nursery.start(partial(service.fork_task, ...))``.

        The fork has the source's root, additional directories, model, mode and thinking
        level; it is provisional (hidden from lists, swept if never prompted) and belongs to
        the signed-in account. The caller must be able to load the source: ``INVALID_CWD``,
        ``INVALID_RELAY``, ``TASK_NOT_FOUND`` / ``WRONG_ACCOUNT``, ``ROOT_MISMATCH`` (``cwd``
        is not the source's root, ``additional_directories``, when given, are not its set, or
        its directories are outside the allowed roots),
        ``WRONG_POLICY``. The source may be leased, even by the caller (its history is only
        read), but not running: ``RUN_ACTIVE`` while a run writes its journal, so a fork never
        holds half a turn whose tool rows would stay unfinished in it. ``UNKNOWN_MESSAGE`` for
        an ``up_to`` the source does not have. Nothing is created when any of these is raised.
        """
        generation = self._fence.admit()
        tools = self._tool_context(relay)
        root = await self._roots.admit(cwd, allowed_roots)
        source = await self._own_task(generation, task_id)
        named = source.additional_directories
        additional = await self._roots.admit_additional(
            named if additional_directories is None else additional_directories, allowed_roots
        )
        check_directories(source, root, additional)
        if source.policy is not TaskPolicy.CALLER_MEDIATED:
            raise RuntimeRejection(RejectionKind.WRONG_POLICY, "the session is not the caller's")
        now = self.now_ms()
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
        )
        # Checked right before the copy with no await between, and the store runs its work
        # one call at a time in arrival order: a run that starts after this check writes its
        # journal after the copy, so the fork holds whole turns only.
        self._leases.check_idle(task_id)
        try:
            await self.store.fork_task(task_id, record, up_to=up_to)
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
        allowed_roots: Sequence[str] = (),
        additional_directories: Sequence[str] = (),
        replace_directories: bool = False,
    ) -> tuple[str, ...]:
        """The attach rule for a caller that already holds ``lease`` (a re-attach): ``cwd`` and
        ``additional_directories`` canonicalised and admitted like any other (``INVALID_CWD``)
        must be the task's root (``ROOT_MISMATCH``) and, unless ``replace_directories`` (a
        resume, which names the session's new set), its set of additional directories.
        Returns the admitted directories, for ``lease.replace_router(..., directories=)``."""
        root = await self._roots.admit(cwd, allowed_roots)
        additional = await self._roots.admit_additional(additional_directories, allowed_roots)
        check_directories(
            lease.task,
            root,
            lease.task.additional_directories if replace_directories else additional,
        )
        return additional

    # -- tasks -------------------------------------------------------------------------------

    async def list_tasks(
        self,
        *,
        cwd: str | None = None,
        cursor: str | None = None,
        limit: int = MAX_LIST_PAGE,
        allowed_roots: Sequence[str] = (),
    ) -> TaskListing:
        """The signed-in account's caller-mediated, non-provisional tasks, newest first, at
        most 100 per page; ``cwd`` filters by exact canonical root: a directory that does not
        exist lists nothing, one outside the allowed roots (or a relative path) is
        ``INVALID_CWD``. ``INVALID_CURSOR`` for a cursor this service did not issue (for this
        query)."""
        generation = self._fence.admit()
        root = None
        if cwd is not None:
            root = await self._roots.admit_filter(cwd, allowed_roots)
            if root is None:
                self._fence.check(generation)
                return TaskListing(tasks=(), next_cursor=None)
        account = self._fence.account_of(generation)
        query = TaskQuery(
            account=account,
            root=root,
            policy=TaskPolicy.CALLER_MEDIATED,
            cursor=cursor,
            limit=max(1, min(limit, MAX_LIST_PAGE)),
        )
        try:
            page = await self.store.list_tasks(query)
        except InvalidCursor as exc:
            raise RuntimeRejection(RejectionKind.INVALID_CURSOR, "the cursor is not valid") from exc
        self._fence.check(generation)
        tasks = tuple(t for t in page.tasks if self._roots.admits(t.root, allowed_roots))
        return TaskListing(tasks=tasks, next_cursor=page.next_cursor)

    async def _own_task(self, generation: int, task_id: str) -> TaskRecord:
        task = await self.store.get_task(task_id)
        account = self._fence.account_of(generation)
        if task is None:
            raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "no such session")
        if task.account != account:
            raise RuntimeRejection(RejectionKind.WRONG_ACCOUNT, "no such session")
        return task

    async def has_task(self, task_id: str) -> bool:
        """Whether the signed-in account has a task by this id (provisional ones included):
        a network client may open a session's stream before it loads the session."""
        try:
            generation = self._fence.admit()
            await self._own_task(generation, task_id)
        except RuntimeRejection:
            return False
        return True

    async def task_history(
        self, task_id: str, *, allowed_roots: Sequence[str] | None = None
    ) -> list[TimelineItem]:
        """A task's history for a viewer without a lease (same rules as
        ``SessionLease.history``): no lease, no model, so any stored task of the account, its
        model retired or not, its task held or not. With ``allowed_roots`` (a listing
        surface's own roots), only a task that surface may list: caller-mediated, its root
        inside both sets of roots (else ``TASK_NOT_FOUND``, as for an unknown id)."""
        generation = self._fence.admit()
        task = await self._own_task(generation, task_id)
        if allowed_roots is not None and (
            task.policy is not TaskPolicy.CALLER_MEDIATED
            or not self._roots.admits(task.root, allowed_roots)
        ):
            raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "no such session")
        items = await self.store.history(task_id)
        self._fence.check(generation)
        return replay_view(items)

    def check_idle(self, task_id: str) -> None:
        """``RUN_ACTIVE`` while the task's holder runs a prompt or a goal cycle. A caller that
        holds the task itself asks this before letting go of it to delete it: its close
        would cancel the run that the delete must refuse."""
        self._leases.check_idle(task_id)

    async def delete_task(self, task_id: str) -> None:
        """Delete one of the account's tasks durably: its history and goal go, the project's
        trust decision stays. ``TASK_NOT_FOUND`` for an unknown id or another account's
        task; ``RUN_ACTIVE`` while a run (a goal cycle included) is active; ``TASK_LEASED``
        while any lease holds it (a caller holding it releases its own lease first). Every
        later operation on the id is ``TASK_NOT_FOUND``."""
        generation = self._fence.admit()
        async with self._sweep_lock:
            task = await self.store.get_task(task_id)
            account = self._fence.account_of(generation)
            if task is None or task.account != account:
                raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "no such session")
            self._leases.check_free(task_id)
            await self.store.delete_task(task_id)
        logger.info("task %s deleted", task_id)

    async def sweep_provisional(self) -> list[str]:
        """Delete provisional tasks whose grace expired and that are still untouched."""
        async with self._sweep_lock:
            deleted = await self.store.sweep_provisional(now_ms=self.now_ms(), stranded=False)
        self._remember_expired(deleted)
        return deleted

    def _remember_expired(self, task_ids: list[str]) -> None:
        """Keep the ids of swept never-prompted tasks (the newest ones), so a client coming
        back for one learns that it expired rather than that it never existed."""
        for task_id in task_ids:
            self._expired[task_id] = None
        while len(self._expired) > MAX_REMEMBERED_EXPIRED:
            del self._expired[next(iter(self._expired))]

    def _expired_rejection(self, task_id: str) -> RuntimeRejection:
        grace = self.provisional_grace_ms / 1000
        return RuntimeRejection(
            RejectionKind.TASK_NOT_FOUND,
            f"session {task_id} expired before its first prompt",
            detail=(
                f"a session that was never prompted is kept {grace:.0f} s after its client "
                "disconnects, then deleted; the host's grace setting (serve --grace) sets how long"
            ),
        )

    # -- trust -------------------------------------------------------------------------------

    async def project_trust(self, cwd: str) -> bool | None:
        generation = self._fence.admit()
        root = await canonical_directory(cwd)
        account = self._fence.account_of(generation)
        return await self.store.get_trust(account, root)

    async def set_project_trust(self, cwd: str, trusted: bool | None) -> None:
        """Save (or, with ``None``, forget) the account's decision for a project.
        ``TRUST_BUSY`` while a task of that project is leased or running."""
        generation = self._fence.admit()
        root = await canonical_directory(cwd)
        await self._set_trust(generation, root, trusted, from_lease=False)

    async def _set_trust(
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
        await self.store.set_trust(account, root, trusted, now_ms=self.now_ms())
        self._fence.check(generation)


def _held(lease: SessionLease) -> HeldTask:
    run = lease.active_run
    if lease.revoked:
        state = HeldTaskState.REVOKED
    elif run is None:
        state = HeldTaskState.IDLE
    elif run.pending_permissions:
        state = HeldTaskState.ASKING
    else:
        state = HeldTaskState.RUNNING
    return HeldTask(task=lease.task, mode=lease.mode.id, state=state)
