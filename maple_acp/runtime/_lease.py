"""``SessionLease``: one caller's exclusive, revocable hold on one task.

This module is the lease's public face: every method a caller uses on a held task, each
handing the work to the part of the lease that owns it. The parts never see each other, only
the hooks the lease hands them here:

- ``_lease_life``: how the lease lives and ends (its nursery, revocation, bounded release),
  and the guard every part passes;
- ``_lease_turns``: the prompt slot, run admission, steering, cancelling, starting a run;
- ``_prompt_queue``: the prompts waiting behind a running turn, handed the slot in order;
- ``_lease_settings``: the model, the session mode, the thinking effort;
- ``_lease_skills``: the project skills the backend sees;
- ``_lease_history``: the task's stored history as the lease reads it;
- ``_reattach``: swapping the router and the directories on a re-attach;
- ``_observers``: the windows that follow the task without holding it;
- ``_goal_driver``: the goal and its autonomous cycles;
- ``_background``: the background commands, in the lease's nursery;
- ``_task_row``: the task row they share; ``_context``: what the lease sees of the service.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager

import trio

from maple_acp.model import (
    CommandInfo,
    GoalRecord,
    MessageRow,
    SessionMode,
    TaskRecord,
    TimelineItem,
)
from maple_acp.runtime._attachments import Prompt
from maple_acp.runtime._background import BackgroundCommands, BackgroundInfo
from maple_acp.runtime._barrier import OperationBarrier, PromptClaim, PromptSlot
from maple_acp.runtime._children import LeaseChildren
from maple_acp.runtime._context import LeaseContext
from maple_acp.runtime._goal_driver import GoalCycleDriver
from maple_acp.runtime._lease_history import LeaseHistory
from maple_acp.runtime._lease_life import LeaseLifetime, RouterFactory
from maple_acp.runtime._lease_settings import SessionSettings
from maple_acp.runtime._lease_skills import LeaseSkills
from maple_acp.runtime._lease_turns import LeaseTurns, TurnSession
from maple_acp.runtime._models import ModelChoices
from maple_acp.runtime._observers import Observer, SessionObservers
from maple_acp.runtime._options import BooleanOption
from maple_acp.runtime._prompt_queue import PromptQueue, Withdrawn
from maple_acp.runtime._reattach import Reattachment
from maple_acp.runtime._run import Run
from maple_acp.runtime._session_events import QueueChanged, QueuedPrompt, SessionEvents
from maple_acp.runtime._steering import SteeringOutcome
from maple_acp.runtime._task_row import TaskRow
from maple_acp.runtime._tools import ToolContext
from maple_acp.runtime._trust import SkillInfo, TrustStatus


def _nothing() -> None:
    """The default ``decided`` callback: a caller with no order to keep."""


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
        context: LeaseContext,
        *,
        task: TaskRecord,
        generation: int,
        installation_id: str,
        created_here: bool,
        tools: ToolContext,
        goal: GoalRecord | None,
        history_locked: bool = False,
    ) -> None:
        self._context = context
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
        self._row = TaskRow(task, created_here=created_here, history_locked=history_locked)
        self._observers = SessionObservers(
            now_ms=context.now_ms, publish=lambda event: self._events.publish(event)
        )
        self._events = SessionEvents(mirror=self._observers.mirror)
        barrier = OperationBarrier()
        self._barrier = barrier
        slot = self._slot = PromptSlot()
        life = self._life = LeaseLifetime(
            context=context,
            generation=generation,
            tools=tools,
            events=self._events,
            barrier=barrier,
            row=self._row.provisional,
            on_revoke=self._on_revoke,
        )
        self._history = LeaseHistory(task_id=task.id, guard=life, store=context.store)
        self._settings = SessionSettings(
            row=self._row,
            guard=life,
            slot=slot,
            store=context.store,
            now_ms=context.now_ms,
            model_choices=lambda refresh: context.model_choices(generation, refresh),
            modes=context.modes,
            thought_levels=context.thought_levels,
            publish=self._events.publish,
            boolean_options=context.boolean_options,
        )
        # Background commands live in the lease's nursery: its revocation ends them.
        self._background = BackgroundCommands(
            task_id=task.id,
            tools=tools,
            nursery=lambda: life.nursery,
            store=context.store,
            now_ms=context.now_ms,
            publish=self._events.publish,
        )
        tools.background = self._background
        # Every shell, MCP call and file write through the lease's tools meets the mode.
        settings = self._settings
        tools.set_gate(lambda category: settings.declaration.refusal(category))
        self._skills = LeaseSkills(
            root=task.root,
            guard=life,
            saved_trust=lambda: context.store.get_trust(self.account, task.root),
            save_trust=lambda trusted: context.set_trust(generation, task.root, trusted),
        )
        # Child sessions run inside this lease's runs, on its tools and directories.
        self._children = LeaseChildren(
            task=lambda: self._row.record,
            store=context.store,
            backend=context.backend,
            now_ms=context.now_ms,
            model=context.subagent_model,
        )
        turns = self._turns = LeaseTurns(
            row=self._row,
            guard=life,
            slot=slot,
            barrier=barrier,
            nursery=lambda: life.nursery,
            store=context.store,
            backend=context.backend,
            policy=context.policy,
            now_ms=context.now_ms,
            tools=tools,
            commands=context.declared_commands(),
            session=TurnSession(
                load_skills=self._skills.known,
                skills=lambda: self._skills.visible,
                goal=lambda: self._goals.goal,
                set_goal=self._set_goal_from_run,
                mode=lambda: settings.declaration,
                thought_level=lambda: settings.thought_level,
                option_values=lambda: settings.option_values,
                model_choices=lambda: context.model_choices(generation, False),
                known_models=lambda: context.known_models(generation),
                poke=lambda: self._goals.poke(),
                observe=self._observers.watch,
            ),
            children=self._children,
        )
        events = self._events
        self._queue = PromptQueue(
            slot=slot,
            guard=life,
            prompt_running=lambda: turns.prompt_running,
            now_ms=context.now_ms,
            changed=lambda entries: events.publish(QueueChanged(task.id, entries)),
        )
        self._reattach = Reattachment(
            row=self._row,
            guard=life,
            store=context.store,
            busy=lambda: self._turns.busy,
            swap_router=life.replace_router,
            poke=lambda: self._goals.poke(),
        )
        self._goals = GoalCycleDriver(
            task_id=task.id,
            goal=goal,
            store=context.store,
            now_ms=context.now_ms,
            events=self._events,
            read_history=lambda: turns.turn_inputs(""),
            launch_cycle=turns.launch_cycle,
            active_run=lambda: turns.active_run,
            quiescent=self._quiescent,
        )

    # -- state -------------------------------------------------------------------------------

    @property
    def task(self) -> TaskRecord:
        """The task row as this lease last saw it."""
        return self._row.record

    @property
    def revoked(self) -> bool:
        return self._life.revoked

    @property
    def released(self) -> bool:
        """Cleanup finished; the task is free for another lease."""
        return self._life.released

    @property
    def model_locked(self) -> bool:
        """The model is locked: the task has an admitted user message, or its history holds
        one (a fork's copy) (``set_model`` then accepts only the current model)."""
        return self._row.model_locked

    @property
    def busy(self) -> bool:
        """A run is active, or a prompt holds the slot (its run is still to start): what a
        fork or a delete of the task must wait for, as for a run."""
        return self._turns.busy

    @property
    def active_run(self) -> Run | None:
        """The task's running run (a prompt's or a goal cycle's), if any."""
        return self._turns.active_run

    @property
    def skills(self) -> tuple[SkillInfo, ...]:
        """Project skills the backend sees: empty unless the project is trusted."""
        return self._skills.visible

    @property
    def goal(self) -> GoalRecord | None:
        return self._goals.goal

    @property
    def commands(self) -> tuple[CommandInfo, ...]:
        """The backend's available commands (a prompt starting with ``/name`` reaches it
        unchanged): what it declared when the lease was made, or what a turn set since."""
        return self._turns.commands

    def session_events(self) -> SessionEvents:
        """Events outside any prompt: ``GoalChanged``, ``CycleStarted`` and ``PromptStarted``
        (read that run's events like a prompt's), ``LeaseRevoked``. One consumer."""
        return self._events.take()

    # -- the operation barrier ---------------------------------------------------------------

    def operation(self) -> AbstractContextManager[None]:
        """Mark caller work on this lease as in flight (``drain`` and ``release`` wait for it).
        Raises ``LEASE_REVOKED`` and the admission kinds when the lease cannot be used."""
        return self._life.operation()

    async def drain(self) -> None:
        """The operation barrier: wait until no operation of this lease is in flight and no
        run is active. Does not cancel anything itself (``cancel_run`` or ``revoke`` does)."""
        await self._barrier.wait_idle()

    # -- models, modes and thinking effort ---------------------------------------------------

    async def model_choices(self, *, refresh: bool = False) -> ModelChoices:
        return await self._settings.model_choices(refresh)

    async def set_model(
        self, model_id: str, *, decided: Callable[[], None] = _nothing
    ) -> TaskRecord:
        """Choose the task's model. Allowed until the first admitted user message; after it
        only the current model is accepted (``MODEL_LOCKED`` otherwise). ``UNKNOWN_MODEL`` if
        the catalog does not offer it.

        A prompt that holds the slot but whose message is not stored yet (a trust question,
        its admission) decides the lock: this waits until it stored its message or gave up,
        calling ``decided`` as it starts waiting (the caller's later requests need not wait
        for that prompt's outcome)."""
        return await self._settings.set_model(model_id, decided)

    @property
    def modes(self) -> tuple[SessionMode, ...]:
        """The session modes the host offers, in the order a client lists them."""
        return self._settings.modes

    @property
    def mode(self) -> SessionMode:
        """The session's mode: the one stored with the task (the host's default when none is,
        or when the host no longer offers it)."""
        return self._settings.declaration.mode

    async def set_mode(self, mode_id: str) -> SessionMode:
        """Put the session in mode ``mode_id``, stored with the task; publishes
        ``ModeChanged`` when it changes. A running turn meets it from its next tool call.
        ``UNKNOWN_MODE`` (nothing stored) for a mode the host does not offer."""
        return await self._settings.set_mode(mode_id)

    @property
    def thought_levels(self) -> tuple[str, ...]:
        """The thinking-effort levels the backend declares for the task's model (none when it
        declares none)."""
        return self._settings.thought_levels

    @property
    def thought_level(self) -> str | None:
        """The thinking effort chosen for the task, or ``None`` (the backend's own default):
        also ``None`` when the stored level is not one of ``thought_levels`` (the model
        changed, or the backend no longer declares it)."""
        return self._settings.thought_level

    async def set_thought_level(self, level: str | None) -> str | None:
        """Choose the thinking effort sent with each of the task's model requests from now on
        (``None``: the backend's default), stored with the task. ``UNKNOWN_THOUGHT_LEVEL``
        (nothing stored) for a level not in ``thought_levels``."""
        return await self._settings.set_thought_level(level)

    @property
    def boolean_options(self) -> tuple[BooleanOption, ...]:
        """The on/off options the backend declares for every session, in its order."""
        return self._settings.boolean_options

    @property
    def option_values(self) -> Mapping[str, bool]:
        """Each of ``boolean_options``' value for the task: what it set, else the default."""
        return self._settings.option_values

    async def set_boolean_option(self, option_id: str, value: bool) -> bool:
        """Set one of ``boolean_options`` for the task, stored with it; a turn reads it at its
        next decision. ``INVALID_OPTION`` (nothing stored) for an option the backend does not
        declare or a value that is not a bool."""
        return await self._settings.set_boolean_option(option_id, value)

    # -- history -----------------------------------------------------------------------------

    async def history(self) -> list[TimelineItem]:
        """The task's visible history in order, ready for replay: for a tool row whose call
        ended, ``text`` is the terminal output text when there is one (the request summary
        otherwise); ``tool.raw_input`` is kept."""
        return await self._history.timeline()

    async def image_data(self, sha256: str) -> bytes | None:
        """The bytes of an image the task's history names (``None``: no longer stored)."""
        return await self._history.image_data(sha256)

    async def keyed_message(self, key: str) -> str | None:
        """The id of the user message a prompt with idempotency ``key`` inserted in this task,
        if the task remembers the key."""
        return await self._history.keyed_message(key)

    async def replay_rows(self) -> list[TimelineItem | MessageRow]:
        """``history()`` as a replay to a client needs it, cheaper to read: message rows may
        come as ``MessageRow`` values (see ``TaskStore.replay_rows``)."""
        return await self._history.replay_rows()

    async def children_history(self) -> list[tuple[TaskRecord, list[TimelineItem | MessageRow]]]:
        """The task's child sessions in the order they were delegated, each with its history
        as ``replay_rows`` reads it."""
        return await self._history.children()

    # -- trust -------------------------------------------------------------------------------

    async def trust_status(self) -> TrustStatus:
        """Call before the task's first prompt: whether the caller must ask for a trust
        decision (the project has real skill files and no saved decision)."""
        return await self._skills.status()

    async def decide_trust(self, trusted: bool) -> None:
        """Save the account's decision for this task's project and rebuild this lease's skill
        catalog. ``TRUST_BUSY`` while a run of that project is active."""
        await self._skills.decide(trusted)

    async def rebuild_skills(self) -> tuple[SkillInfo, ...]:
        """Recompute the skills the backend sees from the saved decision and the files."""
        return await self._skills.rebuild()

    # -- runs --------------------------------------------------------------------------------

    def claim_prompt(self) -> AbstractContextManager[PromptClaim]:
        """Hold the task's one prompt slot for a caller's whole prompt (a trust question
        before it included), as one operation of the lease. ``RUN_ACTIVE`` if another prompt
        holds it or a prompt's run is active. Pass the claim to ``start_run``."""
        return self._turns.claim_prompt()

    def queue_prompt(
        self, text: str, *, decided: Callable[[], None] = _nothing, window: object = None
    ) -> AbstractAsyncContextManager[PromptClaim | Withdrawn]:
        """Hold the task's prompt slot for a caller's whole prompt, as ``claim_prompt`` does,
        but wait for it instead of being refused: while a prompt holds it (or a prompt's run
        is active) the prompt joins the queue, first in first out, and gets the slot once
        every prompt before it had its turn. ``RUN_ACTIVE`` (naming the limit) when
        ``MAX_QUEUED_PROMPTS`` already wait. ``decided`` is called as it takes the slot or its
        place. Yields ``Withdrawn`` if the prompt was withdrawn while it waited
        (``cancel_queued``, ``remove_queued``, revocation): nothing of it was admitted; answer
        it cancelled, after the prompts of its ``window`` withdrawn before it (``Withdrawn``).
        ``text`` is what a listing previews; the prompt itself goes to ``start_run``."""
        return self._queue.claim(text, decided, window)

    @property
    def queued_prompts(self) -> tuple[QueuedPrompt, ...]:
        """The prompts waiting for the slot, first to run first. Each change is published as a
        ``QueueChanged`` session event."""
        return self._queue.entries

    def remove_queued(self, entry_id: str) -> bool:
        """Withdraw one waiting prompt; False when none waits with ``entry_id``."""
        return self._queue.remove(entry_id)

    def cancel_queued(self) -> int:
        """Withdraw every waiting prompt, first to last; how many there were."""
        return self._queue.clear()

    async def check_images(self, prompt: Prompt) -> None:
        """Refuse (``INVALID_PROMPT``, naming the model) a prompt with images when the
        session's model does not see images."""
        await self._turns.check_images(prompt)

    async def start_run(self, prompt: Prompt | str, *, claim: PromptClaim | None = None) -> Run:
        """Admit ``prompt`` as the task's next user message (durably, before the backend sees
        it) and start a run for it. A running goal cycle is cancelled first and the prompt
        admitted after it ended. ``RUN_ACTIVE`` if another prompt holds the slot or a prompt's
        run is still active. Without ``claim`` the slot is claimed for the admission only.

        The prompt's images (checked by ``check_image``) are stored with the message, once
        per hash; ``INVALID_PROMPT`` if the session's model does not see images. The turn
        gets the ``Prompt`` whole."""
        return await self._turns.start_run(prompt, claim)

    async def steer(
        self, message: Prompt | str, *, decided: Callable[[], None] = _nothing
    ) -> SteeringOutcome:
        """Steer the running prompt turn with ``message`` (the caller checked it is a
        non-empty message; ``INVALID_PROMPT`` if it carries images, which a steering message
        has no place for): ``INJECTED`` once it is durably in the history, after what the
        run said so far; the backend takes it at its next step (``Turn.steering()``), or as
        the message of a follow-up backend turn of the same run if it did not take it. A
        pending permission question is not interrupted. ``IDLE`` (nothing admitted) when no prompt's
        run is active (a goal cycle is not a prompt turn): the caller may ``start_run``.

        While a prompt holds the slot but its run does not take steering (being admitted,
        a trust question, cancelled and ending, answered but not yet released) this waits
        for that run to start or the slot to be free. ``RUN_ACTIVE`` when the run already
        holds ``MAX_WAITING_STEERS`` messages it has not taken.

        ``decided`` is called once the message's turn is known: before it is written into a
        running turn, or as it starts waiting for the prompt that holds the slot (with
        ``IDLE`` the caller decides: nothing is called)."""
        return await self._turns.steer(message, decided)

    def cancel_run(self) -> bool:
        """Cancel the active run, if any. True if there was one."""
        return self._turns.cancel_run()

    # -- child sessions ----------------------------------------------------------------------

    @property
    def running_children(self) -> tuple[str, ...]:
        """The task ids of the child sessions whose turn runs now (inside this lease's run)."""
        return self._children.running

    def cancel_child(self, child_id: str) -> bool:
        """Cancel child session ``child_id``'s turn alone: the parent's turn goes on, its
        delegation told the child was cancelled. False when no such child runs now."""
        return self._children.cancel(child_id)

    # -- background commands -----------------------------------------------------------------

    def background_commands(self) -> tuple[BackgroundInfo, ...]:
        """The session's background commands: those running, then the last ones that ended."""
        self._life.check_live()
        return self._background.list()

    def stop_background(self, handle: str) -> bool:
        """Stop background command ``handle`` (SIGTERM, then SIGKILL after the grace). False
        when it had already ended; ``KeyError`` for a handle this session never gave."""
        self._life.check_live()
        return self._background.stop(handle)

    # -- goals -------------------------------------------------------------------------------

    async def set_goal(self, objective: str, *, token_budget: int | None = None) -> GoalRecord:
        """Give the task a new active goal (the objective is trimmed; ``INVALID_GOAL`` if
        blank). A running goal cycle of the previous goal is cancelled."""
        with self._life.operation():
            return await self._goals.set(objective, token_budget)

    async def pause_goal(self) -> GoalRecord:
        """``GOAL_STATE`` unless the goal is active. A running goal cycle is cancelled."""
        with self._life.operation():
            return await self._goals.pause()

    async def resume_goal(self) -> GoalRecord:
        """``GOAL_STATE`` unless the goal is paused, blocked or limited."""
        with self._life.operation():
            return await self._goals.resume()

    async def clear_goal(self) -> None:
        """Remove the goal (no effect without one); publishes ``GoalChanged(goal=None)``."""
        with self._life.operation():
            await self._goals.clear()

    async def _set_goal_from_run(self, objective: str, token_budget: int | None) -> GoalRecord:
        self._life.check_live()
        return await self._goals.set(objective, token_budget)

    def _quiescent(self) -> bool:
        return self._turns.idle and not self._reattach.swapping and self._life.live()

    # -- re-attach ---------------------------------------------------------------------------

    async def replace_router(
        self,
        router_factory: RouterFactory | None,
        *,
        directories: Sequence[str] | None = None,
    ) -> None:
        """Re-attach with another set of external tools (``None``: none). ``RUN_ACTIVE``
        while a prompt holds the slot or any run (a goal cycle included) is active. The new
        router starts in the lease's nursery first; if that fails its error propagates (the
        same error a first attach raises) and the old router stays; on success the old one
        is revoked. No goal cycle starts while the swap is under way.

        ``directories``, when given, become the task's additional directories once the new
        router serves (canonical and admitted: ``AgentService.reattach`` passes them)."""
        await self._reattach.replace_router(router_factory, directories)

    # -- observers ---------------------------------------------------------------------------

    def attach_observer(self) -> Observer:
        """Another window follows this task without holding it (the holder keeps the lease):
        the returned ``Observer`` holds a snapshot of the runs being read, then yields what
        follows (their events, prompts' user messages, goal, mode and background events)
        until it is detached: by ``Observer.detach``, by falling ``OBSERVER_BACKLOG`` events
        behind, or when this lease is revoked. Its permission requests carry tickets of its
        own; the first window's clean answer decides. ``OBSERVERS_FULL`` beyond
        ``MAX_OBSERVERS``."""
        self._life.check_live()
        return self._observers.attach()

    @property
    def observers(self) -> int:
        """How many windows observe this task now."""
        return len(self._observers)

    # -- revocation and release --------------------------------------------------------------

    def revoke(self, reason: str = "the session was revoked") -> None:
        """Synchronously withdraw every capability: cancel the active run (its pending
        permissions resolve as denied), drop the relay values and the router, send SIGTERM to
        child process groups, reject every later operation. Idempotent. The task stays blocked
        for other leases until ``release`` (or the end of ``serve_*``) finishes cleanup."""
        self._life.revoke(reason)

    def _on_revoke(self) -> None:
        # Nothing waiting was admitted: withdrawn, it is answered cancelled by its caller.
        self._queue.clear()
        self._observers.end()
        self._turns.cancel_run()
        self._slot.changed()
        self._goals.poke()

    async def release(self, *, close: bool = False) -> None:
        """Revoke, then wait for cleanup: operations drained, children killed, and the task
        freed. With ``close=True`` (an explicit close) a provisional task never prompted
        (created by this lease or loaded by it) is deleted if its row is unchanged; otherwise
        (a disconnect) a still provisional task gets the service's grace period. If the caller
        stops waiting (its own deadline), cleanup goes on in the lease's task."""
        await self._life.release(close=close)

    async def serve(
        self,
        router_factory: RouterFactory | None,
        *,
        task_status: trio.TaskStatus[SessionLease],
    ) -> None:
        """Serve this lease until it is released (``AgentService`` calls this)."""

        def started() -> None:
            task_status.started(self)
            self._goals.poke()

        await self._life.serve(
            router_factory,
            main=self._goals.drive,
            started=started,
            unregister=lambda: self._context.unregister(self.task_id, self),
        )
