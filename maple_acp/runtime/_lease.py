"""``SessionLease``: one caller's exclusive, revocable hold on one task.

This module is the lease's public face: every method a caller uses on a held task (prompt
claims, operations, models, modes, trust, steering, relay values, router swaps). How the lease
lives and ends is in ``_lease_life``, its goal cycles in ``_goal_driver``, what it shares with
the service in ``_context``.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import trio

from maple_acp._text import one_line
from maple_acp.model import (
    CommandInfo,
    GoalRecord,
    ItemKind,
    MessageRow,
    SessionMode,
    TaskRecord,
    TimelineItem,
)
from maple_acp.runtime._attachments import Prompt
from maple_acp.runtime._backend import backend_accepts_images
from maple_acp.runtime._barrier import OperationBarrier, PromptClaim
from maple_acp.runtime._context import LeaseContext
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._events import RunKind
from maple_acp.runtime._goal_driver import GoalCycleDriver
from maple_acp.runtime._history import replay_rows_view, replay_view, title_from_history
from maple_acp.runtime._lease_life import LeaseLifetime, ProvisionalRow, RouterFactory
from maple_acp.runtime._models import ModelChoices
from maple_acp.runtime._modes import ModeDeclaration
from maple_acp.runtime._offer import offered_tools
from maple_acp.runtime._outlet import RunHooks, RunOutlet
from maple_acp.runtime._run import Run, user_message_id
from maple_acp.runtime._session_events import ModeChanged, SessionEvents
from maple_acp.runtime._steering import SlotWatch, SteeringOutcome
from maple_acp.runtime._tools import ToolContext
from maple_acp.runtime._trust import ProjectSkills, SkillInfo, TrustStatus
from maple_acp.runtime._turn import Turn

logger = logging.getLogger(__name__)

#: A model id quoted in a notice is cut to this many characters.
MAX_SHOWN_MODEL_CHARS = 200


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
        self._task = task
        self._row = ProvisionalRow(task, created_here=created_here)
        #: The task's history holds a user message although the task is still provisional (a
        #: fork of a prompted session): its model is as locked as its source's.
        self._history_locked = history_locked
        # None until known: a task reads its project's trust before its first run, not when
        # it is opened (clients open many sessions they never prompt).
        self._skills: tuple[SkillInfo, ...] | None = None
        #: The scan ``trust_status`` made for a decision still to come: the decision reuses it
        #: instead of scanning the project a second time.
        self._undecided: ProjectSkills | None = None
        self._events = SessionEvents()
        self._barrier = OperationBarrier()
        self._active_run: Run | None = None
        self._admission = trio.Lock()
        self._claim: PromptClaim | None = None
        #: Wakes steering messages waiting for a prompt's run to start or the slot to free.
        self._slot = SlotWatch()
        self._prompt_waiting = 0
        self._replacing_router = False
        self._title_tried = False
        self._commands = context.declared_commands()
        self._run_serial = 0
        self._mode = self._restored_mode(task)
        #: The thinking-effort levels of the model they were last listed for.
        self._levels: tuple[str | None, tuple[str, ...]] | None = None
        # Every shell, MCP call and file write through the lease's tools meets the mode.
        tools.set_gate(lambda category: self._mode.refusal(category))
        self._life = LeaseLifetime(
            context=context,
            generation=generation,
            tools=tools,
            events=self._events,
            barrier=self._barrier,
            row=self._row,
            on_revoke=self._on_revoke,
        )
        self._goals = GoalCycleDriver(
            task_id=task.id,
            goal=goal,
            store=context.store,
            now_ms=context.now_ms,
            events=self._events,
            read_history=lambda: self._turn_inputs(""),
            launch_cycle=self._launch_cycle,
            active_run=lambda: self._active_run,
            quiescent=self._quiescent,
        )

    # -- state -------------------------------------------------------------------------------

    @property
    def task(self) -> TaskRecord:
        """The task row as this lease last saw it."""
        return self._task

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
        return self._row.prompted or self._history_locked

    @property
    def busy(self) -> bool:
        """A run is active, or a prompt holds the slot (its run is still to start): what a
        fork or a delete of the task must wait for, as for a run."""
        return self._active_run is not None or self._claim is not None

    @property
    def active_run(self) -> Run | None:
        """The task's running run (a prompt's or a goal cycle's), if any."""
        return self._active_run

    @property
    def skills(self) -> tuple[SkillInfo, ...]:
        """Project skills the backend sees: empty unless the project is trusted."""
        return self._skills or ()

    @property
    def goal(self) -> GoalRecord | None:
        return self._goals.goal

    @property
    def commands(self) -> tuple[CommandInfo, ...]:
        """The backend's available commands (a prompt starting with ``/name`` reaches it
        unchanged): what it declared when the lease was made, or what a turn set since."""
        return self._commands

    def session_events(self) -> SessionEvents:
        """Events outside any prompt: ``GoalChanged``, ``CycleStarted`` (read that run's events
        like a prompt's), ``LeaseRevoked``. One consumer; ends after the lease's cleanup."""
        return self._events.take()

    # -- the operation barrier ---------------------------------------------------------------

    @contextmanager
    def operation(self) -> Iterator[None]:
        """Mark caller work on this lease as in flight (``drain`` and ``release`` wait for it).
        Raises ``LEASE_REVOKED`` and the admission kinds when the lease cannot be used."""
        self._life.check_live()
        with self._barrier.operation():
            yield

    async def drain(self) -> None:
        """The operation barrier: wait until no operation of this lease is in flight and no
        run is active. Does not cancel anything itself (``cancel_run`` or ``revoke`` does)."""
        await self._barrier.wait_idle()

    # -- models ------------------------------------------------------------------------------

    async def model_choices(self, *, refresh: bool = False) -> ModelChoices:
        with self.operation():
            choices = await self._context.model_choices(self.generation, refresh)
            self._life.check_live()
            return choices

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
        with self.operation():
            while self._claim is not None and not self.model_locked:
                decided()
                await self._slot.wait()
                self._life.check_live()
            async with self._admission:
                self._life.check_live()
                if self.model_locked:
                    if model_id == self._task.model:
                        return self._task
                    raise RuntimeRejection(
                        RejectionKind.MODEL_LOCKED,
                        "the model is locked once the session has a message",
                    )
                choices = await self._context.model_choices(self.generation, False)
                self._life.check_live()
                if model_id not in choices:
                    raise RuntimeRejection(
                        RejectionKind.UNKNOWN_MODEL, "the model is not in the catalog"
                    )
                record = await self._context.store.set_task_model(
                    self.task_id, model_id, now_ms=self._context.now_ms()
                )
                if record is None:
                    raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "the session is gone")
                self._task = record
                self._row.rewritten(record)
                self._life.check_live()
                return record

    # -- modes and thinking effort -----------------------------------------------------------

    def _restored_mode(self, task: TaskRecord) -> ModeDeclaration:
        modes = self._context.modes
        declared = modes.get(task.mode)
        if declared is not None:
            return declared
        if task.mode is not None:
            logger.warning(
                "task %s was in session mode %r, which this host no longer offers; "
                "it is in the default mode %s",
                task.id,
                task.mode[:64],
                modes.default.mode.id,
            )
        return modes.default

    @property
    def modes(self) -> tuple[SessionMode, ...]:
        """The session modes the host offers, in the order a client lists them."""
        return self._context.modes.modes

    @property
    def mode(self) -> SessionMode:
        """The session's mode: the one stored with the task (the host's default when none is,
        or when the host no longer offers it)."""
        return self._mode.mode

    async def set_mode(self, mode_id: str) -> SessionMode:
        """Put the session in mode ``mode_id``, stored with the task; publishes
        ``ModeChanged`` when it changes. A running turn meets it from its next tool call.
        ``UNKNOWN_MODE`` (nothing stored) for a mode the host does not offer."""
        with self.operation():
            declared = self._context.modes.get(mode_id) if isinstance(mode_id, str) else None
            if declared is None:
                raise RuntimeRejection(
                    RejectionKind.UNKNOWN_MODE, "the session mode is not one this host offers"
                )
            async with self._admission:
                self._life.check_live()
                if declared is self._mode:
                    return declared.mode
                record = await self._context.store.set_task_mode(self.task_id, declared.mode.id)
                if record is None:
                    raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "the session is gone")
                self._task = record
                self._row.rewritten(record)
                self._mode = declared
                self._events.publish(ModeChanged(self.task_id, declared.mode))
                return declared.mode

    @property
    def thought_levels(self) -> tuple[str, ...]:
        """The thinking-effort levels the backend declares for the task's model (none when it
        declares none)."""
        model = self._task.model
        if self._levels is None or self._levels[0] != model:
            self._levels = (model, self._context.thought_levels(model))
        return self._levels[1]

    @property
    def thought_level(self) -> str | None:
        """The thinking effort chosen for the task, or ``None`` (the backend's own default):
        also ``None`` when the stored level is not one of ``thought_levels`` (the model
        changed, or the backend no longer declares it)."""
        level = self._task.thought_level
        return level if level is not None and level in self.thought_levels else None

    async def set_thought_level(self, level: str | None) -> str | None:
        """Choose the thinking effort sent with each of the task's model requests from now on
        (``None``: the backend's default), stored with the task. ``UNKNOWN_THOUGHT_LEVEL``
        (nothing stored) for a level not in ``thought_levels``."""
        with self.operation():
            if level is not None and (
                not isinstance(level, str) or level not in self.thought_levels
            ):
                raise RuntimeRejection(
                    RejectionKind.UNKNOWN_THOUGHT_LEVEL,
                    "the thinking effort is not one the session's model offers",
                )
            async with self._admission:
                self._life.check_live()
                if level == self._task.thought_level:
                    return level
                record = await self._context.store.set_task_thought_level(self.task_id, level)
                if record is None:
                    raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "the session is gone")
                self._task = record
                self._row.rewritten(record)
                return level

    # -- history -----------------------------------------------------------------------------

    async def history(self) -> list[TimelineItem]:
        """The task's visible history in order, ready for replay: for a tool row whose call
        ended, ``text`` is the terminal output text when there is one (the request summary
        otherwise); ``tool.raw_input`` is kept."""
        with self.operation():
            items = await self._context.store.history(self.task_id)
            self._life.check_live()
            return replay_view(items)

    async def image_data(self, sha256: str) -> bytes | None:
        """The bytes of an image the task's history names (``None``: no longer stored)."""
        with self.operation():
            data = await self._context.store.read_blob(sha256)
            self._life.check_live()
            return data

    async def replay_rows(self) -> list[TimelineItem | MessageRow]:
        """``history()`` as a replay to a client needs it, cheaper to read: message rows may
        come as ``MessageRow`` values (see ``TaskStore.replay_rows``)."""
        with self.operation():
            rows = await self._context.store.replay_rows(self.task_id)
            self._life.check_live()
            return replay_rows_view(rows)

    # -- trust -------------------------------------------------------------------------------

    async def trust_status(self) -> TrustStatus:
        """Call before the task's first prompt: whether the caller must ask for a trust
        decision (the project has real skill files and no saved decision)."""
        with self.operation():
            trusted = await self._context.store.get_trust(self.account, self._task.root)
            project = await ProjectSkills.scan(self._task.root, trusted, count_untrusted=True)
            self._life.check_live()
            self._skills = project.visible
            self._undecided = project if trusted is None else None
            return TrustStatus(
                root=self._task.root, trusted=trusted, has_skills=bool(project.found)
            )

    async def decide_trust(self, trusted: bool) -> None:
        """Save the account's decision for this task's project and rebuild this lease's skill
        catalog. ``TRUST_BUSY`` while a run of that project is active."""
        with self.operation():
            await self._context.set_trust(self.generation, self._task.root, trusted)
            scanned, self._undecided = self._undecided, None
            if scanned is None:
                await self._load_skills()
            else:
                self._skills = scanned.decided(trusted).visible

    async def rebuild_skills(self) -> tuple[SkillInfo, ...]:
        """Recompute the skills the backend sees from the saved decision and the files."""
        with self.operation():
            return await self._load_skills()

    async def _load_skills(self) -> tuple[SkillInfo, ...]:
        trusted = await self._context.store.get_trust(self.account, self._task.root)
        project = await ProjectSkills.scan(self._task.root, trusted, count_untrusted=False)
        self._life.check_live()
        self._skills = project.visible
        return project.visible

    async def _turn_inputs(self, run_id: str) -> tuple[TimelineItem, ...]:
        """What a turn reads before it starts: the skills (once per lease, if not yet
        known) and the history so far."""
        if self._skills is None:
            await self._load_skills()
        # Read once per turn; the run's own user message is not "history so far".
        stored = await self._context.store.history(self.task_id)
        return tuple(item for item in stored if item.run_id != run_id)

    # -- runs --------------------------------------------------------------------------------

    @contextmanager
    def claim_prompt(self) -> Iterator[PromptClaim]:
        """Hold the task's one prompt slot for a caller's whole prompt (a trust question
        before it included), as one operation of the lease. ``RUN_ACTIVE`` if another prompt
        holds it or a prompt's run is active. Pass the claim to ``start_run``."""
        with self.operation():
            run = self._active_run
            if self._claim is not None or (run is not None and run.kind is RunKind.PROMPT):
                raise RuntimeRejection(RejectionKind.RUN_ACTIVE, "a prompt is already running")
            claim = self._claim = PromptClaim()
            try:
                yield claim
            finally:
                self._claim = None
                self._slot.changed()

    async def check_images(self, prompt: Prompt) -> None:
        """Refuse (``INVALID_PROMPT``, naming the model) a prompt with images when the
        session's model does not see images."""
        if not prompt.images:
            return
        with self.operation():
            model = self._task.model
            if backend_accepts_images(self._context.backend, model):
                return
            if model is None:
                model = (await self._context.model_choices(self.generation, False)).default
                self._life.check_live()
            shown = one_line(model, MAX_SHOWN_MODEL_CHARS)
            raise RuntimeRejection(
                RejectionKind.INVALID_PROMPT,
                f"the model {shown} does not accept images; send text, or choose a model that does",
            )

    async def start_run(self, prompt: Prompt | str, *, claim: PromptClaim | None = None) -> Run:
        """Admit ``prompt`` as the task's next user message (durably, before the backend sees
        it) and start a run for it. A running goal cycle is cancelled first and the prompt
        admitted after it ended. ``RUN_ACTIVE`` if another prompt holds the slot or a prompt's
        run is still active. Without ``claim`` the slot is claimed for the admission only.

        The prompt's images (checked by ``check_image``) are stored with the message, once
        per hash; ``INVALID_PROMPT`` if the session's model does not see images. The turn
        gets the ``Prompt`` whole."""
        if isinstance(prompt, str):
            prompt = Prompt(prompt)
        await self.check_images(prompt)
        if claim is None:
            with self.claim_prompt() as own:
                return await self._admit_prompt(prompt, own)
        return await self._admit_prompt(prompt, claim)

    async def _admit_prompt(self, prompt: Prompt, claim: PromptClaim) -> Run:
        with self.operation():
            if claim is not self._claim:
                raise RuntimeRejection(RejectionKind.RUN_ACTIVE, "a prompt is already running")
            async with self._admission:
                self._life.check_live()
                current = self._active_run
                if current is not None and current.kind is RunKind.PROMPT:
                    raise RuntimeRejection(RejectionKind.RUN_ACTIVE, "a prompt is already running")
                self._prompt_waiting += 1
                try:
                    if current is not None:
                        current.cancel()
                        await current.wait()
                    self._life.check_live()
                    run_id = self._new_run_id()
                    now = self._context.now_ms()
                    item = TimelineItem(
                        item_id=user_message_id(run_id),
                        kind=ItemKind.USER,
                        created_ms=now,
                        run_id=run_id,
                        text=prompt.text,
                        images=prompt.image_refs,
                    )
                    record = await self._context.store.admit_user_message(
                        self.task_id,
                        item,
                        now_ms=now,
                        blobs=prompt.image_bytes or None,
                    )
                    self._task = record
                    self._row.admitted()
                    history = await self._turn_inputs(run_id)
                    self._life.check_live()
                    return await self._launch(run_id, RunKind.PROMPT, prompt, history)
                finally:
                    self._prompt_waiting -= 1
                    self._goals.poke()

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
        text = message if isinstance(message, str) else message.text
        if not isinstance(message, str) and message.images:
            raise RuntimeRejection(
                RejectionKind.INVALID_PROMPT, "a steering message carries text only"
            )
        with self.operation():
            while True:
                self._life.check_live()
                run = self._active_run
                if run is not None and run.takes_steering:
                    decided()
                    await run.admit_steering(text, now_ms=self._context.now_ms())
                    return SteeringOutcome.INJECTED
                if self._claim is None and (run is None or run.kind is not RunKind.PROMPT):
                    return SteeringOutcome.IDLE
                decided()
                await self._slot.wait()

    def cancel_run(self) -> bool:
        """Cancel the active run, if any. True if there was one."""
        run = self._active_run
        if run is None:
            return False
        run.cancel()
        return True

    async def _launch_cycle(self, objective: str, history: tuple[TimelineItem, ...]) -> Run:
        return await self._launch(
            self._new_run_id(), RunKind.GOAL_CYCLE, Prompt(objective), history
        )

    async def _launch(
        self,
        run_id: str,
        kind: RunKind,
        prompt: Prompt,
        history: tuple[TimelineItem, ...],
    ) -> Run:
        # No checkpoint before the run is the active one: whoever checked that the task was
        # free (the prompt admission, the goal driver) must still be right when it starts.
        nursery = self._life.nursery
        context = self._context
        hooks = RunHooks(
            now_ms=context.now_ms,
            policy=context.policy,
            set_title=self._set_title,
            set_goal=self._set_goal_from_run,
            redactor=self.tools.redactor,
            set_commands=self._set_commands,
            auto_title=self._auto_title,
            mode=lambda: self._mode,
            roots=(self._task.root, *self._task.additional_directories),
            thought_level=lambda: self.thought_level,
        )
        task, skills, goal, tools = self._task, self.skills, self._goals.goal, self.tools
        offered = offered_tools(tools.router if not tools.revoked else None)

        def make_turn(outlet: RunOutlet) -> Turn:
            return Turn(
                outlet,
                task_id=task.id,
                kind=kind,
                prompt=prompt,
                model=task.model,
                root=task.root,
                skills=skills,
                goal=goal,
                tools=tools,
                history=history,
                offered_tools=offered,
                read_blob=context.store.read_blob,
            )

        run = Run(
            run_id=run_id,
            task_id=self.task_id,
            kind=kind,
            hooks=hooks,
            store=context.store,
            make_turn=make_turn,
            notices=self._model_notices(task.model),
        )
        self._active_run = run
        self._barrier.run_started()
        self._slot.changed()
        await nursery.start(
            lambda task_status: run.drive(
                context.backend, on_end=self._run_ended, task_status=task_status
            )
        )
        return run

    def _model_notices(self, model: str | None) -> tuple[tuple[str, str], ...]:
        """A warning when the host's latest model listing no longer offers the session's
        (locked) model: the session keeps it, and the user should know why it may fail."""
        known = self._context.known_models(self.generation)
        if model is None or known is None or model in known:
            return ()
        shown = one_line(model, MAX_SHOWN_MODEL_CHARS)
        return (
            (
                "warning",
                f"the session's model {shown} is no longer offered by the host; "
                "this session keeps it, but it may not answer",
            ),
        )

    def _run_ended(self, run: Run) -> None:
        if self._active_run is run:
            self._active_run = None
            self._barrier.run_ended()
        self._slot.changed()
        self._goals.poke()

    def _new_run_id(self) -> str:
        self._run_serial += 1
        return f"r{self._run_serial}-{secrets.token_hex(4)}"

    async def _set_title(self, title: str) -> None:
        record = await self._context.store.rename_task(
            self.task_id, title, user_renamed=False, now_ms=self._context.now_ms()
        )
        if record is not None:
            self._task = record

    def _set_commands(self, commands: tuple[CommandInfo, ...]) -> None:
        self._commands = commands

    async def _auto_title(self) -> str | None:
        # A backend's own set_title came first and wins; and a task whose first message has
        # no line to take is not searched again at every prompt of this lease.
        if self._task.title or self._title_tried:
            return None
        self._title_tried = True
        title = title_from_history(await self._context.store.history(self.task_id))
        if title is not None:
            await self._set_title(title)
        return title

    # -- goals -------------------------------------------------------------------------------

    async def set_goal(self, objective: str, *, token_budget: int | None = None) -> GoalRecord:
        """Give the task a new active goal (the objective is trimmed; ``INVALID_GOAL`` if
        blank). A running goal cycle of the previous goal is cancelled."""
        with self.operation():
            return await self._goals.set(objective, token_budget)

    async def pause_goal(self) -> GoalRecord:
        """``GOAL_STATE`` unless the goal is active. A running goal cycle is cancelled."""
        with self.operation():
            return await self._goals.pause()

    async def resume_goal(self) -> GoalRecord:
        """``GOAL_STATE`` unless the goal is paused, blocked or limited."""
        with self.operation():
            return await self._goals.resume()

    async def clear_goal(self) -> None:
        """Remove the goal (no effect without one); publishes ``GoalChanged(goal=None)``."""
        with self.operation():
            await self._goals.clear()

    async def _set_goal_from_run(self, objective: str, token_budget: int | None) -> GoalRecord:
        self._life.check_live()
        return await self._goals.set(objective, token_budget)

    def _quiescent(self) -> bool:
        return (
            self._active_run is None
            and not self._prompt_waiting
            and not self._replacing_router
            and self._life.live()
        )

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
        with self.operation():
            if self._claim is not None or self._active_run is not None or self._replacing_router:
                raise RuntimeRejection(RejectionKind.RUN_ACTIVE, "a run is active in the session")
            self._replacing_router = True
            try:
                await self._life.replace_router(router_factory)
                if directories is not None:
                    await self._store_directories(directories)
            finally:
                self._replacing_router = False
                self._goals.poke()

    async def _store_directories(self, directories: Sequence[str]) -> None:
        if frozenset(directories) == frozenset(self._task.additional_directories):
            return
        record = await self._context.store.set_task_directories(self.task_id, tuple(directories))
        if record is None:
            raise RuntimeRejection(RejectionKind.TASK_NOT_FOUND, "the session is gone")
        self._task = record
        self._row.rewritten(record)
        self._life.check_live()

    # -- revocation and release --------------------------------------------------------------

    def revoke(self, reason: str = "the session was revoked") -> None:
        """Synchronously withdraw every capability: cancel the active run (its pending
        permissions resolve as denied), drop the relay values and the router, send SIGTERM to
        child process groups, reject every later operation. Idempotent. The task stays blocked
        for other leases until ``release`` (or the end of ``serve_*``) finishes cleanup."""
        self._life.revoke(reason)

    def _on_revoke(self) -> None:
        self.cancel_run()
        self._slot.changed()
        self._goals.poke()

    async def release(self, *, close: bool = False) -> None:
        """Revoke, then wait for cleanup: operations drained, children killed, and the task
        freed. With ``close=True`` (an explicit close) a provisional task this lease created and
        never prompted is deleted if its row is unchanged; otherwise (a disconnect) a still
        provisional task gets the service's grace period. If the caller stops waiting (its
        own deadline), cleanup goes on in the lease's task."""
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
