"""``SessionLease``: one caller's exclusive, revocable hold on one task."""

from __future__ import annotations

import collections
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs
import trio

from maple_acp.model import GoalRecord, GoalStatus, ItemKind, TaskRecord, TaskSurface, TimelineItem
from maple_acp.runtime import _goals
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._events import (
    CycleStarted,
    GoalChanged,
    LeaseRevoked,
    RunKind,
    SessionEvent,
)
from maple_acp.runtime._models import ModelChoices
from maple_acp.runtime._run import Run, RunHooks, Turn
from maple_acp.runtime._tools import ExternalToolRouter, ToolContext
from maple_acp.runtime._trust import SkillInfo, find_project_skills_async

if TYPE_CHECKING:
    from maple_acp.runtime._service import AgentService

logger = logging.getLogger(__name__)

#: Session events waiting for the lease holder. Goal snapshots coalesce (only the newest
#: matters) and a goal cycle starts only when there is room, so this bound is never hit by a
#: slow reader; it only caps memory.
SESSION_EVENT_QUEUE = 64
#: Cleanup after a release or revocation: waiting for operations, provisional-task handling
#: and killing children, all within one bound.
LEASE_CLEANUP_BOUND_S = 5.0

#: Called inside the lease's own nursery before the lease is handed out, so a caller can start
#: a lease-scoped router there (and connect it) before ownership is committed.
RouterFactory = Callable[[trio.Nursery], Awaitable[ExternalToolRouter | None]]


class SessionEvents:
    """The lease's session event stream (goal changes, goal cycles, revocation), readable by one
    consumer; it ends when the lease's cleanup ends."""

    def __init__(self) -> None:
        self._queue: collections.deque[SessionEvent] = collections.deque()
        self._changed = trio.Event()
        self._closed = False
        self._taken = False

    def publish(self, event: SessionEvent) -> None:
        if self._closed:
            return
        if isinstance(event, GoalChanged):
            self._queue = collections.deque(
                queued for queued in self._queue if not isinstance(queued, GoalChanged)
            )
        elif len(self._queue) >= SESSION_EVENT_QUEUE:
            logger.warning("session event queue full; dropping %s", type(event).__name__)
            return
        self._queue.append(event)
        self._wake()

    def has_room(self) -> bool:
        return len(self._queue) < SESSION_EVENT_QUEUE - 1

    async def wait_room(self) -> None:
        while not self.has_room() and not self._closed:
            await self._changed.wait()

    def close(self) -> None:
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def __aiter__(self) -> SessionEvents:
        return self

    async def __anext__(self) -> SessionEvent:
        while not self._queue:
            if self._closed:
                raise StopAsyncIteration
            await self._changed.wait()
        event = self._queue.popleft()
        self._wake()
        return event


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


class SessionLease:
    """An opaque, exact-match, revocable capability on one task for one caller (an ACP session,
    or a host window). Obtained from ``AgentService.serve_new_task`` or
    ``AgentService.serve_task``; at most one lease per task exists at a time, and a revoked
    lease keeps blocking others until its cleanup ends.

    Every method raises ``RuntimeRejection(LEASE_REVOKED)`` once the lease is revoked, and the
    service's admission kinds (``ACCOUNT_CHANGED``, ``SHUTTING_DOWN``) when the account changed
    after the lease was made or the service drains.
    """

    def __init__(
        self,
        service: AgentService,
        *,
        task: TaskRecord,
        generation: int,
        installation_id: str,
        created_here: bool,
        tools: ToolContext,
        goal: GoalRecord | None,
        skills: tuple[SkillInfo, ...],
    ) -> None:
        self._service = service
        #: Opaque id of this lease (never reused).
        self.id = secrets.token_urlsafe(16)
        self.task_id = task.id
        self.account = task.account
        self.surface = task.surface
        self.installation_id = installation_id
        self.generation = generation
        #: True when this lease created its task (``serve_new_task``); a loaded task never is.
        self.created_here = created_here
        self.tools = tools
        self._task = task
        # The row as this lease last wrote it; provisional deletion needs it to be unchanged.
        self._snapshot: TaskRecord | None = task if created_here and task.provisional else None
        self._prompted = not task.provisional
        self._goal = goal
        self._goal_epoch = 0
        self._skills = skills
        self._session = SessionEvents()
        self._session_taken = False
        self._nursery: trio.Nursery | None = None
        self._active_run: Run | None = None
        self._admission = trio.Lock()
        self._prompt_waiting = 0
        self._ops = 0
        self._idle = trio.Event()
        self._idle.set()
        self._goal_wake = trio.Event()
        self._revoked = False
        self._close_requested = False
        self._release_requested = trio.Event()
        self._done = trio.Event()
        self._run_serial = 0

    # -- state -------------------------------------------------------------------------------

    @property
    def task(self) -> TaskRecord:
        """The task row as this lease last saw it."""
        return self._task

    @property
    def revoked(self) -> bool:
        return self._revoked

    @property
    def released(self) -> bool:
        """Cleanup finished; the task is free for another lease."""
        return self._done.is_set()

    @property
    def active_run(self) -> Run | None:
        """The task's running run (a prompt's or a goal cycle's), if any."""
        return self._active_run

    @property
    def skills(self) -> tuple[SkillInfo, ...]:
        """Project skills the backend sees: empty unless the project is trusted."""
        return self._skills

    @property
    def goal(self) -> GoalRecord | None:
        return self._goal

    def session_events(self) -> SessionEvents:
        """Events outside any prompt: ``GoalChanged``, ``CycleStarted`` (read that run's events
        like a prompt's), ``LeaseRevoked``. One consumer; ends after the lease's cleanup."""
        if self._session_taken:
            raise RuntimeError("a lease's session events can be read only once")
        self._session_taken = True
        return self._session

    # -- models ------------------------------------------------------------------------------

    async def model_choices(self, *, refresh: bool = False) -> ModelChoices:
        with self._operation():
            choices = await self._service._model_choices(self.generation, refresh=refresh)
            self._check_live()
            return choices

    async def set_model(self, model_id: str) -> TaskRecord:
        """Choose the task's model. Allowed until the first admitted user message; after it
        only the current model is accepted (``MODEL_LOCKED`` otherwise). ``UNKNOWN_MODEL`` if
        the catalog does not offer it."""
        with self._operation():
            async with self._admission:
                self._check_live()
                if self._prompted:
                    if model_id == self._task.model:
                        return self._task
                    raise RuntimeRejection(
                        RejectionKind.MODEL_LOCKED,
                        "the model is locked once the task has a message",
                    )
                choices = await self._service._model_choices(self.generation, refresh=False)
                self._check_live()
                if model_id not in choices:
                    raise RuntimeRejection(
                        RejectionKind.UNKNOWN_MODEL, "the model is not in the catalog"
                    )
                record = await self._service.store.set_task_model(
                    self.task_id, model_id, now_ms=self._service.now_ms()
                )
                if record is None:
                    raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "the task is gone")
                self._task = record
                if self._snapshot is not None:
                    self._snapshot = record
                self._check_live()
                return record

    # -- history -----------------------------------------------------------------------------

    async def history(self) -> list[TimelineItem]:
        """The task's visible history in order, ready for replay: for a tool row whose call
        ended, ``text`` is the terminal output text when there is one (the request summary
        otherwise); ``tool.raw_input`` is kept."""
        with self._operation():
            items = await self._service.store.history(self.task_id)
            self._check_live()
            return replay_view(items)

    # -- trust -------------------------------------------------------------------------------

    async def trust_status(self) -> TrustStatus:
        """Call before the task's first prompt: whether the caller must ask for a trust
        decision (the project has real skill files and no saved decision)."""
        with self._operation():
            root = self._task.root
            trusted = await self._service.store.get_trust(self.account, root)
            skills = await find_project_skills_async(root)
            self._check_live()
            return TrustStatus(root=root, trusted=trusted, has_skills=bool(skills))

    async def decide_trust(self, trusted: bool) -> None:
        """Save the account's decision for this task's project and rebuild this lease's skill
        catalog. ``TRUST_BUSY`` while a run of that project is active."""
        with self._operation():
            await self._service._set_trust(
                self.generation, self._task.root, trusted, allow_lease=self
            )
            await self.rebuild_skills()

    async def rebuild_skills(self) -> tuple[SkillInfo, ...]:
        """Recompute the skills the backend sees from the saved decision and the files."""
        with self._operation():
            trusted = await self._service.store.get_trust(self.account, self._task.root)
            skills = await find_project_skills_async(self._task.root) if trusted else ()
            self._check_live()
            self._skills = skills
            return skills

    # -- runs --------------------------------------------------------------------------------

    async def start_run(self, prompt: str) -> Run:
        """Admit ``prompt`` as the task's next user message (durably, before the backend sees
        it) and start a run for it. A running goal cycle is cancelled first and the prompt
        admitted after it ended. ``RUN_ACTIVE`` if a prompt's run is still active."""
        with self._operation():
            async with self._admission:
                self._check_live()
                current = self._active_run
                if current is not None and current.kind is RunKind.PROMPT:
                    raise RuntimeRejection(RejectionKind.RUN_ACTIVE, "a prompt is already running")
                self._prompt_waiting += 1
                try:
                    if current is not None:
                        current.cancel()
                        await current.wait()
                    self._check_live()
                    run_id = self._new_run_id()
                    now = self._service.now_ms()
                    item = TimelineItem(
                        item_id=f"{run_id}-u",
                        kind=ItemKind.USER,
                        created_ms=now,
                        run_id=run_id,
                        text=prompt,
                    )
                    record = await self._service.store.admit_user_message(
                        self.task_id, item, now_ms=now
                    )
                    self._task = record
                    self._prompted = True
                    self._snapshot = None
                    self._check_live()
                    return await self._launch(run_id, RunKind.PROMPT, prompt)
                finally:
                    self._prompt_waiting -= 1
                    self._poke_goals()

    def cancel_run(self) -> bool:
        """Cancel the active run, if any. True if there was one."""
        run = self._active_run
        if run is None:
            return False
        run.cancel()
        return True

    async def _launch(self, run_id: str, kind: RunKind, prompt: str) -> Run:
        assert self._nursery is not None
        hooks = RunHooks(
            store=self._service.store,
            now_ms=self._service.now_ms,
            policy=self._service.policy,
            set_title=self._set_title,
            set_goal=self._set_goal_from_run,
        )
        run = Run(run_id=run_id, task_id=self.task_id, kind=kind, hooks=hooks)
        run.turn = Turn(
            run,
            prompt=prompt,
            model=self._task.model,
            root=self._task.root,
            skills=self._skills,
            goal=self._goal,
            tools=self.tools,
        )
        self._active_run = run
        self._not_idle()
        await self._nursery.start(
            lambda task_status: run.drive(
                self._service.backend, on_end=self._run_ended, task_status=task_status
            )
        )
        return run

    def _run_ended(self, run: Run) -> None:
        if self._active_run is run:
            self._active_run = None
        self._maybe_idle()
        self._poke_goals()

    def _new_run_id(self) -> str:
        self._run_serial += 1
        return f"r{self._run_serial}-{secrets.token_hex(4)}"

    async def _set_title(self, title: str) -> None:
        record = await self._service.store.rename_task(
            self.task_id, title, user_renamed=False, now_ms=self._service.now_ms()
        )
        if record is not None:
            self._task = record

    # -- goals -------------------------------------------------------------------------------

    async def set_goal(self, objective: str, *, token_budget: int | None = None) -> GoalRecord:
        """Give the task a new active goal (the objective is trimmed; ``INVALID_GOAL`` if
        blank). A running goal cycle of the previous goal is cancelled."""
        with self._operation():
            return await self._set_goal_from_run(objective, token_budget)

    async def pause_goal(self) -> GoalRecord:
        """``GOAL_STATE`` unless the goal is active. A running goal cycle is cancelled."""
        with self._operation():
            goal = _goals.paused(self._goal, now_ms=self._service.now_ms())
            self._cancel_cycle()
            return await self._store_goal(goal)

    async def resume_goal(self) -> GoalRecord:
        """``GOAL_STATE`` unless the goal is paused, blocked or limited."""
        with self._operation():
            goal = _goals.resumed(self._goal, now_ms=self._service.now_ms())
            return await self._store_goal(goal)

    async def clear_goal(self) -> None:
        """Remove the goal (no effect without one); publishes ``GoalChanged(goal=None)``."""
        with self._operation():
            self._goal_epoch += 1
            self._cancel_cycle()
            await self._put_goal(None)

    async def _set_goal_from_run(self, objective: str, token_budget: int | None) -> GoalRecord:
        self._check_live()
        goal = _goals.new_goal(objective, now_ms=self._service.now_ms(), token_budget=token_budget)
        self._goal_epoch += 1
        self._cancel_cycle()
        return await self._store_goal(goal)

    async def _store_goal(self, goal: GoalRecord) -> GoalRecord:
        await self._put_goal(goal)
        return goal

    async def _put_goal(self, goal: GoalRecord | None) -> None:
        # The in-memory goal changes first: a cycle ending while the write is in flight must
        # already see a pause or a clear, or it would start the next cycle.
        self._goal = goal
        self._poke_goals()
        await self._service.store.put_goal(self.task_id, goal)
        self._session.publish(GoalChanged(self.task_id, goal))

    def _cancel_cycle(self) -> None:
        run = self._active_run
        if run is not None and run.kind is RunKind.GOAL_CYCLE:
            run.cancel()

    def _poke_goals(self) -> None:
        self._goal_wake.set()

    def _cycle_due(self) -> bool:
        goal = self._goal
        return (
            goal is not None
            and goal.status is GoalStatus.ACTIVE
            and self._active_run is None
            and not self._prompt_waiting
            and not self._revoked
            and self._service._admits(self.generation)
        )

    async def _drive_goals(self) -> None:
        """Run autonomous goal cycles while the goal is active and the task quiescent."""
        try:
            while True:
                await self._goal_wake.wait()
                self._goal_wake = trio.Event()
                if not self._cycle_due():
                    continue
                await self._session.wait_room()
                if not self._cycle_due():
                    continue
                goal = self._goal
                assert goal is not None
                epoch = self._goal_epoch
                run = await self._launch(self._new_run_id(), RunKind.GOAL_CYCLE, goal.objective)
                self._session.publish(CycleStarted(run))
                outcome = await run.wait()
                current = self._goal
                if current is None or epoch != self._goal_epoch:
                    continue
                turn = run.turn
                progress = turn.goal_progress if turn is not None else None
                updated = _goals.after_cycle(
                    current, outcome, progress, now_ms=self._service.now_ms()
                )
                if updated is not None:
                    with trio.CancelScope(shield=True):
                        await self._store_goal(updated)
                self._poke_goals()
        except Exception:
            logger.exception("goal cycles of task %s stopped", self.task_id)

    # -- operations, revocation, release -----------------------------------------------------

    def _check_live(self) -> None:
        if self._revoked:
            raise RuntimeRejection(RejectionKind.LEASE_REVOKED, "the session was revoked")
        self._service._admit(self.generation)

    @contextmanager
    def _operation(self) -> Iterator[None]:
        self._check_live()
        self._ops += 1
        self._not_idle()
        try:
            yield
        finally:
            self._ops -= 1
            self._maybe_idle()

    def _not_idle(self) -> None:
        if self._idle.is_set():
            self._idle = trio.Event()

    def _maybe_idle(self) -> None:
        if self._ops == 0 and self._active_run is None:
            self._idle.set()

    def revoke(self, reason: str = "the session was revoked") -> None:
        """Synchronously withdraw every capability: cancel the active run (its pending
        permissions resolve as denied), drop the relay values and the router, send SIGTERM to
        child process groups, reject every later operation. Idempotent. The task stays blocked
        for other leases until ``release`` (or the end of ``serve_*``) finishes cleanup."""
        if self._revoked:
            return
        self._revoked = True
        run = self._active_run
        if run is not None:
            run.cancel()
        self.tools.revoke()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        self._session.publish(LeaseRevoked(reason))
        self._poke_goals()

    async def drain(self) -> None:
        """The operation barrier: wait until no operation of this lease is in flight and no
        run is active. Does not cancel anything itself (``cancel_run`` or ``revoke`` does)."""
        await self._idle.wait()

    async def release(self, *, close: bool = False) -> None:
        """Revoke, then wait for cleanup: operations drained, children killed, and the task
        freed. With ``close=True`` (an explicit close) a provisional task this lease created and
        never prompted is deleted if its row is unchanged; otherwise (a disconnect) a still
        provisional task gets the service's grace period. If the caller stops waiting (its
        own deadline), cleanup goes on in the lease's task."""
        if close and not self._done.is_set():
            self._close_requested = True
        self.revoke("the session was released")
        self._release_requested.set()
        await self._done.wait()

    async def serve(
        self,
        router_factory: RouterFactory | None,
        *,
        task_status: trio.TaskStatus[SessionLease],
    ) -> None:
        started = False
        setup_error: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._revoked:
                    nursery.cancel_scope.cancel()
                if router_factory is not None:
                    try:
                        router = await router_factory(nursery)
                        self.tools.install_router(router)
                    except Exception as exc:
                        setup_error = exc
                        nursery.cancel_scope.cancel()
                if setup_error is None and not self._revoked:
                    try:
                        self._check_live()
                    except RuntimeRejection as exc:
                        setup_error = exc
                        nursery.cancel_scope.cancel()
                    else:
                        nursery.start_soon(self._drive_goals)
                        started = True
                        task_status.started(self)
                        self._poke_goals()
                        await trio.sleep_forever()
            if setup_error is not None:
                raise setup_error
            if not started:
                raise RuntimeRejection(RejectionKind.LEASE_REVOKED, "the session was revoked")
            await self._release_requested.wait()
        finally:
            if not started:
                # Never handed out: nothing of it can have been used, so clean up as a close.
                self._close_requested = True
            with trio.CancelScope(shield=True):
                with trio.move_on_after(LEASE_CLEANUP_BOUND_S):
                    await self._cleanup()
                self.tools.revoke()
                for pgid in self.tools.live_process_groups:
                    logger.warning("process group %d outlived its lease cleanup", pgid)
                self._service._unregister(self)
                self._session.close()
                self._done.set()

    async def _cleanup(self) -> None:
        self.revoke("the session was released")
        await self._idle.wait()
        try:
            await self._settle_provisional()
        except Exception:
            logger.warning("could not settle provisional task %s", self.task_id, exc_info=True)
        await self.tools.reap()

    async def _settle_provisional(self) -> None:
        store = self._service.store
        current = await store.get_task(self.task_id)
        if current is None or not current.provisional or self.surface is not TaskSurface.EXTERNAL:
            return
        grace = self._service.provisional_grace_ms
        untouched = self.created_here and not self._prompted and self._snapshot is not None
        if untouched and (self._close_requested or grace == 0):
            assert self._snapshot is not None
            if await store.delete_task_if_unchanged(self._snapshot):
                logger.debug("deleted untouched provisional task %s", self.task_id)
                return
        await store.set_provisional_expiry(self.task_id, self._service.now_ms() + grace)


def replay_view(items: list[TimelineItem]) -> list[TimelineItem]:
    """History as it is replayed: an ended tool row shows its terminal output text."""
    view: list[TimelineItem] = []
    for item in items:
        tool = item.tool
        if (
            item.kind is ItemKind.TOOL
            and tool is not None
            and tool.status.terminal
            and tool.output_text
        ):
            item = attrs.evolve(item, text=tool.output_text)
        view.append(item)
    return view
