"""``AgentService``: the transport-neutral runtime facade.

This module is the service's public face: every method a host or the edge calls on it
(opening, attaching, forking, listing and deleting tasks, models, trust, relay values,
status), each saying its rules and handing the work to the part that owns it:

- ``_opener``: opening a lease on a new, a stored or a forked task;
- ``_account_tasks``: the account's stored tasks without a lease (list, history, delete);
- ``_sweep``: the provisional sweep and the ids it deleted;
- ``_project_trust``: trust decisions and when they are refused;
- ``_models``: the catalog behind the fence; ``_admission``: the fence and the project roots;
- ``_registry``: which lease holds which task; ``_lease``: a lease itself.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection, Mapping, Sequence

import trio

from maple_acp._tool_env import check_tool_env_allow
from maple_acp.model import TaskSurface, TimelineItem
from maple_acp.runtime._account_tasks import MAX_LIST_PAGE, AccountTasks
from maple_acp.runtime._admission import AdmissionFence, ProjectRoots
from maple_acp.runtime._attachments import PromptCapabilities
from maple_acp.runtime._backend import (
    AgentBackend,
    backend_boolean_options,
    backend_commands,
    backend_prompt_capabilities,
    backend_thought_levels,
)
from maple_acp.runtime._context import LeaseContext
from maple_acp.runtime._lease import SessionLease
from maple_acp.runtime._lease_life import RouterFactory
from maple_acp.runtime._models import AccountModels, ModelCatalog, ModelCatalogCache, ModelChoices
from maple_acp.runtime._modes import BUILTIN_MODES, ModeSet
from maple_acp.runtime._observers import Observer
from maple_acp.runtime._offer import CommandBounds
from maple_acp.runtime._opener import LeaseOpener
from maple_acp.runtime._permissions import PermissionPolicy
from maple_acp.runtime._project_trust import ProjectTrust
from maple_acp.runtime._registry import LeaseRegistry
from maple_acp.runtime._relay import RelayValues
from maple_acp.runtime._replies import HeldTask, HeldTaskState, ServiceStatus, TaskListing
from maple_acp.runtime._self_serving import ServedInOwnNursery
from maple_acp.runtime._sweep import ProvisionalSweep
from maple_acp.store import TaskStore

logger = logging.getLogger(__name__)

#: How long a provisional task released without a close stays loadable by id: clients split
#: "create" and "prompt" across processes.
DEFAULT_PROVISIONAL_GRACE_S = 600.0
#: The longest grace period accepted (ten years): its milliseconds must fit the store.
MAX_PROVISIONAL_GRACE_S = 10 * 365 * 24 * 3600.0
#: ``drain`` waits this long for cancelled runs to end.
DRAIN_BOUND_S = 5.0


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
        subagent_model: str | None = None,
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
        #: The catalog's cache (kept by name: a test swaps its catalog).
        self._models = ModelCatalogCache(catalog)
        self._fence = AdmissionFence()
        self._account_models = AccountModels(self._models, self._fence)
        self._leases = LeaseRegistry()
        self._command_bounds = CommandBounds()
        self._sweep = ProvisionalSweep(
            store=store, now_ms=self.now_ms, grace_ms=self.provisional_grace_ms
        )
        self._wall_anchor_ms = 0
        self._trio_anchor = 0.0
        self._trust = ProjectTrust(
            store=store, fence=self._fence, leases=self._leases, now_ms=self.now_ms
        )
        self._tasks = AccountTasks(
            store=store,
            fence=self._fence,
            roots=self._roots,
            leases=self._leases,
            sweep=self._sweep,
        )
        models = self._account_models
        lease_context = LeaseContext(
            store=store,
            backend=backend,
            policy=policy,
            now_ms=self.now_ms,
            provisional_grace_ms=self.provisional_grace_ms,
            check_admitted=self._fence.check,
            admits=self._fence.admits,
            model_choices=models.choices,
            known_models=models.known,
            set_trust=lambda generation, root, trusted: self._trust.save(
                generation, root, trusted, from_lease=True
            ),
            unregister=self._leases.remove,
            declared_commands=lambda: self._command_bounds.of(backend_commands(backend)),
            modes=modes,
            thought_levels=lambda model: backend_thought_levels(backend, model),
            boolean_options=backend_boolean_options(backend),
            subagent_model=subagent_model,
        )
        self._opener = LeaseOpener(
            store=store,
            fence=self._fence,
            roots=self._roots,
            models=models,
            tasks=self._tasks,
            sweep=self._sweep,
            leases=self._leases,
            lease_context=lease_context,
            installation_id=installation_id,
            relay_allow_list=self.relay_allow_list,
            tool_env_allow=self.tool_env_allow,
            now_ms=self.now_ms,
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
        await self._sweep.at_start()
        self._fence.ready = True
        task_status.started()
        try:
            await self._sweep.sweep_periodically()
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
        return await self._account_models.choices(self._fence.admit(), refresh)

    def cached_model_choices(self) -> ModelChoices:
        """The last listing for this account, or only the host default: never waits."""
        return self._account_models.cached()

    # -- leases ------------------------------------------------------------------------------

    def accept_relay(self, offered: Mapping[str, str]) -> RelayValues:
        """Check relay values a connector offers, once: names the host does not allow are
        left out (``RelayValues.dropped`` counts them), the rest must meet the limits.
        ``INVALID_RELAY`` otherwise; the message names a variable, never a value. Pass the
        result as ``relay=`` to ``serve_new_task``/``serve_task``."""
        return RelayValues.accept(offered, self.relay_allow_list)

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
        await self._opener.serve_new_task(
            cwd,
            relay=relay,
            router_factory=router_factory,
            model=model,
            surface=surface,
            allowed_roots=allowed_roots,
            additional_directories=additional_directories,
            task_status=task_status,
        )

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
        await self._opener.serve_task(
            task_id,
            cwd,
            relay=relay,
            router_factory=router_factory,
            allowed_roots=allowed_roots,
            additional_directories=additional_directories,
            replace_directories=replace_directories,
            task_status=task_status,
        )

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
        await self._opener.fork_task(
            task_id,
            cwd=cwd,
            up_to=up_to,
            relay=relay,
            router_factory=router_factory,
            allowed_roots=allowed_roots,
            additional_directories=additional_directories,
            task_status=task_status,
        )

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
        return await self._opener.check_root(
            lease,
            cwd,
            allowed_roots=allowed_roots,
            additional_directories=additional_directories,
            replace_directories=replace_directories,
        )

    async def observe_task(
        self,
        task_id: str,
        cwd: str,
        *,
        allowed_roots: Sequence[str] = (),
        additional_directories: Sequence[str] = (),
        replace_directories: bool = False,
    ) -> tuple[SessionLease, Observer] | None:
        """Follow a task another caller holds, without holding it (another window on it): the
        lease, and an ``Observer`` of it (see ``SessionLease.attach_observer``). ``None`` when
        no live lease holds the task: the caller may open it (``serve_task``). The attach rule
        is a re-attach's (``check_root``: ``INVALID_CWD``, ``ROOT_MISMATCH``), then
        ``OBSERVERS_FULL`` beyond ``MAX_OBSERVERS``, and the admission kinds."""
        self._fence.admit()
        lease = self._leases.of(task_id)
        if lease is None or lease.revoked:
            return None
        await self.check_root(
            lease,
            cwd,
            allowed_roots=allowed_roots,
            additional_directories=additional_directories,
            replace_directories=replace_directories,
        )
        return lease, lease.attach_observer()

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
        return await self._tasks.listing(
            cwd=cwd, cursor=cursor, limit=limit, allowed_roots=allowed_roots
        )

    async def has_task(self, task_id: str) -> bool:
        """Whether the signed-in account has a task by this id (provisional ones included):
        a network client may open a session's stream before it loads the session."""
        return await self._tasks.has(task_id)

    async def task_history(
        self, task_id: str, *, allowed_roots: Sequence[str] | None = None
    ) -> list[TimelineItem]:
        """A task's history for a viewer without a lease (same rules as
        ``SessionLease.history``): no lease, no model, so any stored task of the account, its
        model retired or not, its task held or not. With ``allowed_roots`` (a listing
        surface's own roots), only a task that surface may list: caller-mediated, its root
        inside both sets of roots (else ``TASK_NOT_FOUND``, as for an unknown id)."""
        return await self._tasks.history(task_id, allowed_roots)

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
        await self._tasks.delete(task_id)

    async def sweep_provisional(self) -> list[str]:
        """Delete provisional tasks whose grace expired and that are still untouched."""
        return await self._sweep.sweep()

    # -- trust -------------------------------------------------------------------------------

    async def project_trust(self, cwd: str) -> bool | None:
        return await self._trust.decision(cwd)

    async def set_project_trust(self, cwd: str, trusted: bool | None) -> None:
        """Save (or, with ``None``, forget) the account's decision for a project.
        ``TRUST_BUSY`` while a task of that project is leased or running."""
        await self._trust.decide(cwd, trusted)


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
