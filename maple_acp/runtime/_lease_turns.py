"""A lease's turns: its one prompt slot and the run admission behind it, steering a running
turn, cancelling it, and starting a run (a prompt's or a goal cycle's) in the lease's nursery
with the hooks that run may use."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager

import attrs
import trio

from maple_acp._text import one_line
from maple_acp.model import CommandInfo, GoalRecord, ItemKind, TimelineItem
from maple_acp.runtime._attachments import Prompt
from maple_acp.runtime._backend import AgentBackend, backend_accepts_images
from maple_acp.runtime._barrier import OperationBarrier, PromptClaim, PromptSlot
from maple_acp.runtime._children import LeaseChildren
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection
from maple_acp.runtime._events import RunKind
from maple_acp.runtime._history import title_from_history
from maple_acp.runtime._lease_life import LeaseGuard
from maple_acp.runtime._models import ModelChoices
from maple_acp.runtime._modes import ModeDeclaration
from maple_acp.runtime._offer import offered_tools
from maple_acp.runtime._outlet import RunHooks, RunOutlet
from maple_acp.runtime._permissions import PermissionPolicy
from maple_acp.runtime._run import Run, user_message_id
from maple_acp.runtime._steering import SteeringOutcome
from maple_acp.runtime._task_row import TaskRow
from maple_acp.runtime._tools import ToolContext
from maple_acp.runtime._trust import SkillInfo
from maple_acp.runtime._turn import Turn
from maple_acp.store import TaskStore

#: A model id quoted in a notice is cut to this many characters.
MAX_SHOWN_MODEL_CHARS = 200


@attrs.frozen(kw_only=True)
class TurnSession:
    """What a turn reads of the rest of its session at the moment it starts (or, for the
    mode and the thinking effort, at each decision): kept narrow so the turns never reach
    into the lease's other parts."""

    #: Read the skills if the lease has not yet (before the first turn's history).
    load_skills: Callable[[], Awaitable[None]]
    skills: Callable[[], tuple[SkillInfo, ...]]
    goal: Callable[[], GoalRecord | None]
    #: A goal the backend set from inside a run.
    set_goal: Callable[[str, int | None], Awaitable[GoalRecord]]
    mode: Callable[[], ModeDeclaration]
    thought_level: Callable[[], str | None]
    #: The task's boolean options now (each declared one, set or default).
    option_values: Callable[[], Mapping[str, bool]]
    #: The model choices of the lease's account, without a refresh.
    model_choices: Callable[[], Awaitable[ModelChoices]]
    #: The account's last refreshed listing, without waiting (``None``: none known).
    known_models: Callable[[], ModelChoices | None]
    #: Something changed that may make a goal cycle due (a run ended, a prompt gave up).
    poke: Callable[[], None]
    #: A run starts (with its prompt, for a prompt's run): the lease's observers follow it.
    observe: Callable[[Run, Prompt | None], None] = lambda run, prompt: None


class LeaseTurns:
    """The runs of one leased task, at most one at a time. A prompt holds the slot from its
    claim to its answer; its message is admitted durably under the slot's admission lock,
    after any running goal cycle ended; its run then starts in the lease's nursery."""

    def __init__(
        self,
        *,
        row: TaskRow,
        guard: LeaseGuard,
        slot: PromptSlot,
        barrier: OperationBarrier,
        nursery: Callable[[], trio.Nursery],
        store: TaskStore,
        backend: AgentBackend,
        policy: PermissionPolicy,
        now_ms: Callable[[], int],
        tools: ToolContext,
        commands: tuple[CommandInfo, ...],
        session: TurnSession,
        children: LeaseChildren | None = None,
    ) -> None:
        self._row = row
        self._guard = guard
        self._slot = slot
        self._barrier = barrier
        self._nursery = nursery
        self._store = store
        self._backend = backend
        self._policy = policy
        self._now_ms = now_ms
        self._tools = tools
        self._session = session
        self._children = children
        self.commands = commands
        self.active_run: Run | None = None
        #: Prompts being admitted (a goal cycle must not start meanwhile).
        self.prompts_waiting = 0
        self._title_tried = False
        self._run_serial = 0

    @property
    def busy(self) -> bool:
        return self.active_run is not None or self._slot.held

    @property
    def prompt_running(self) -> bool:
        """A prompt's run is active (a goal cycle is not a prompt turn)."""
        return (run := self.active_run) is not None and run.kind is RunKind.PROMPT

    @property
    def idle(self) -> bool:
        """No run is active and no prompt is being admitted (a goal cycle may start)."""
        return self.active_run is None and not self.prompts_waiting

    # -- the prompt slot and admission -------------------------------------------------------

    @contextmanager
    def claim_prompt(self) -> Iterator[PromptClaim]:
        with self._guard.operation():
            if self._slot.held or self.prompt_running:
                raise RuntimeRejection(RejectionKind.RUN_ACTIVE, "a prompt is already running")
            with self._slot.hold() as claim:
                yield claim

    async def check_images(self, prompt: Prompt) -> None:
        if not prompt.images:
            return
        with self._guard.operation():
            model = self._row.record.model
            if backend_accepts_images(self._backend, model):
                return
            if model is None:
                model = (await self._session.model_choices()).default
                self._guard.check_live()
            shown = one_line(model, MAX_SHOWN_MODEL_CHARS)
            raise RuntimeRejection(
                RejectionKind.INVALID_PROMPT,
                f"the model {shown} does not accept images; send text, or choose a model that does",
            )

    async def start_run(self, prompt: Prompt | str, claim: PromptClaim | None) -> Run:
        if isinstance(prompt, str):
            prompt = Prompt(prompt)
        await self.check_images(prompt)
        if claim is None:
            with self.claim_prompt() as own:
                return await self._admit_prompt(prompt, own)
        return await self._admit_prompt(prompt, claim)

    async def _admit_prompt(self, prompt: Prompt, claim: PromptClaim) -> Run:
        with self._guard.operation():
            if claim is not self._slot.claim:
                raise RuntimeRejection(RejectionKind.RUN_ACTIVE, "a prompt is already running")
            async with self._slot.admission:
                self._guard.check_live()
                current = self.active_run
                if current is not None and current.kind is RunKind.PROMPT:
                    raise RuntimeRejection(RejectionKind.RUN_ACTIVE, "a prompt is already running")
                self.prompts_waiting += 1
                try:
                    if current is not None:
                        current.cancel()
                        await current.wait()
                    self._guard.check_live()
                    run_id = self._new_run_id()
                    now = self._now_ms()
                    item = TimelineItem(
                        item_id=user_message_id(run_id),
                        kind=ItemKind.USER,
                        created_ms=now,
                        run_id=run_id,
                        text=prompt.text,
                        images=prompt.image_refs,
                    )
                    record = await self._store.admit_user_message(
                        self._row.record.id,
                        item,
                        now_ms=now,
                        blobs=prompt.image_bytes or None,
                        idempotency_key=prompt.idempotency_key,
                    )
                    self._row.admitted(record)
                    history = await self.turn_inputs(run_id)
                    self._guard.check_live()
                    return await self._launch(run_id, RunKind.PROMPT, prompt, history)
                finally:
                    self.prompts_waiting -= 1
                    self._session.poke()

    # -- a running turn ----------------------------------------------------------------------

    async def steer(self, message: Prompt | str, decided: Callable[[], None]) -> SteeringOutcome:
        text = message if isinstance(message, str) else message.text
        if not isinstance(message, str) and message.images:
            raise RuntimeRejection(
                RejectionKind.INVALID_PROMPT, "a steering message carries text only"
            )
        with self._guard.operation():
            while True:
                self._guard.check_live()
                run = self.active_run
                if run is not None and run.takes_steering:
                    decided()
                    await run.admit_steering(text, now_ms=self._now_ms())
                    return SteeringOutcome.INJECTED
                if not self._slot.held and (run is None or run.kind is not RunKind.PROMPT):
                    return SteeringOutcome.IDLE
                decided()
                await self._slot.wait()

    def cancel_run(self) -> bool:
        run = self.active_run
        if run is None:
            return False
        run.cancel()
        return True

    # -- starting a run ----------------------------------------------------------------------

    async def turn_inputs(self, run_id: str) -> tuple[TimelineItem, ...]:
        """What a turn reads before it starts: the skills (once per lease, if not yet
        known) and the history so far."""
        await self._session.load_skills()
        # Read once per turn; the run's own user message is not "history so far".
        stored = await self._store.history(self._row.record.id)
        return tuple(item for item in stored if item.run_id != run_id)

    async def launch_cycle(self, objective: str, history: tuple[TimelineItem, ...]) -> Run:
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
        nursery = self._nursery()
        session = self._session
        store = self._store
        task = self._row.record
        hooks = RunHooks(
            now_ms=self._now_ms,
            policy=self._policy,
            set_title=self._set_title,
            set_goal=session.set_goal,
            redactor=self._tools.redactor,
            set_commands=self._set_commands,
            auto_title=self._auto_title,
            mode=session.mode,
            roots=(task.root, *task.additional_directories),
            thought_level=session.thought_level,
            option_values=session.option_values,
        )
        skills, goal, tools = session.skills(), session.goal(), self._tools
        offered = offered_tools(tools.router if not tools.revoked else None)
        delegator = self._children.for_run() if self._children is not None else None

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
                read_blob=store.read_blob,
                delegator=delegator,
            )

        run = Run(
            run_id=run_id,
            task_id=task.id,
            kind=kind,
            hooks=hooks,
            store=store,
            make_turn=make_turn,
            notices=self._model_notices(task.model),
        )
        session.observe(run, prompt if kind is RunKind.PROMPT else None)
        self.active_run = run
        self._barrier.run_started()
        self._slot.changed()
        backend = self._backend
        await nursery.start(
            lambda task_status: run.drive(backend, on_end=self._run_ended, task_status=task_status)
        )
        return run

    def _model_notices(self, model: str | None) -> tuple[tuple[str, str], ...]:
        """A warning when the host's latest model listing no longer offers the session's
        (locked) model: the session keeps it, and the user should know why it may fail."""
        known = self._session.known_models()
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
        if self.active_run is run:
            self.active_run = None
            self._barrier.run_ended()
        self._slot.changed()
        self._session.poke()

    def _new_run_id(self) -> str:
        self._run_serial += 1
        return f"r{self._run_serial}-{secrets.token_hex(4)}"

    # -- what a run reports back -------------------------------------------------------------

    async def _set_title(self, title: str) -> None:
        record = await self._store.rename_task(
            self._row.record.id, title, user_renamed=False, now_ms=self._now_ms()
        )
        if record is not None:
            self._row.retitled(record)

    def _set_commands(self, commands: tuple[CommandInfo, ...]) -> None:
        self.commands = commands

    async def _auto_title(self) -> str | None:
        # A backend's own set_title came first and wins; and a task whose first message has
        # no line to take is not searched again at every prompt of this lease.
        if self._row.record.title or self._title_tried:
            return None
        self._title_tried = True
        title = title_from_history(await self._store.history(self._row.record.id))
        if title is not None:
            await self._set_title(title)
        return title
