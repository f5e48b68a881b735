"""Child sessions: the turns a run delegates to, each a task of its own under the run's task.

A child's turn runs inside its parent's run, in the call that delegated it: cancelling the
parent's run cancels its children within the same deadline, and a child ends before its
parent's run can. Its events reach the parent's caller through the parent's own event queue
(wrapped as ``ChildEvent``, in the child's order), so one reader sees the whole tree and a
slow reader slows the children as it slows the parent. A child's permission questions are
its own run's: a deny, a bad answer or a cancel fails closed in the child, and the parent's
model is told the child's outcome as its tool result.

The lease holds the session's part (how many children it started, the running ones by id,
for a caller that cancels one alone); each run holds its own (the places among the running).
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Callable

import trio

from maple_acp.model import GoalRecord, ItemKind, TaskRecord, TimelineItem
from maple_acp.runtime._attachments import Prompt
from maple_acp.runtime._backend import AgentBackend
from maple_acp.runtime._errors import RejectionKind, RuntimeRejection, bounded_text
from maple_acp.runtime._event_queue import RunEventQueue
from maple_acp.runtime._events import (
    ChildAnnounced,
    ChildEnded,
    ChildEvent,
    ChildRunning,
    RunEvent,
    RunKind,
    RunOutcome,
    RunState,
    TextChunk,
)
from maple_acp.runtime._outlet import RunOutlet
from maple_acp.runtime._run import Run, user_message_id
from maple_acp.runtime._tools import ToolUnavailable
from maple_acp.runtime._turn import DelegationResult, Turn
from maple_acp.store import TaskStore

logger = logging.getLogger(__name__)

#: Children running at once for one parent turn: each is a model conversation of its own,
#: and a model that asks for many in one answer must not fan out without bound.
MAX_RUNNING_CHILDREN = 4
#: Children one session may start (refused calls do not count; a fork starts its own count):
#: a runaway model must not fill the store with sessions.
MAX_SESSION_CHILDREN = 16
#: A child's answer as its parent's tool result, at most (the bound on any tool text).
MAX_ANSWER_CHARS = 16_000
#: A child's title (one line), at most.
MAX_CHILD_TITLE_CHARS = 200
#: A delegation prompt, at most: it is a model's own instruction, not a document.
MAX_DELEGATION_PROMPT_CHARS = 64_000

CANCELLED_ANSWER = "the child session was cancelled before it answered"
EMPTY_ANSWER = "the child session finished without an answer"


class LeaseChildren:
    """The child sessions of one lease: the count it started and the ones running now."""

    def __init__(
        self,
        *,
        task: Callable[[], TaskRecord],
        store: TaskStore,
        backend: AgentBackend,
        now_ms: Callable[[], int],
        model: str | None,
    ) -> None:
        self._task = task
        self._store = store
        self._backend = backend
        self._now_ms = now_ms
        #: The host's model for children (``None``: each child takes its parent's).
        self._model = model
        self.started = 0
        self._running: dict[str, Run] = {}
        #: How to cancel each child not yet ended: its wait for a place, then its run.
        self._cancels: dict[str, Callable[[], None]] = {}

    @property
    def running(self) -> tuple[str, ...]:
        """The ids of the children whose turn runs now."""
        return tuple(self._running)

    def cancel(self, child_id: str) -> bool:
        """Cancel child ``child_id``'s turn alone (its parent goes on, told it was cancelled),
        or its wait for a place among the running. False when no child of this lease under
        that id is waiting or running."""
        cancel = self._cancels.get(child_id)
        if cancel is None:
            return False
        cancel()
        return True

    def for_run(self) -> RunDelegation:
        """The delegations of one run (its own places among the running children)."""
        return RunDelegation(self)

    async def delegate(
        self,
        slots: trio.Semaphore,
        turn: Turn,
        outlet: RunOutlet,
        tool_id: str,
        title: str,
        prompt: str,
    ) -> DelegationResult:
        title = bounded_text(title.strip() or "child session", MAX_CHILD_TITLE_CHARS)
        if not prompt.strip():
            raise ToolUnavailable("a delegation needs a prompt")
        if len(prompt) > MAX_DELEGATION_PROMPT_CHARS:
            raise ToolUnavailable(
                f"a delegation prompt is at most {MAX_DELEGATION_PROMPT_CHARS} characters"
            )
        if self.started >= MAX_SESSION_CHILDREN:
            raise ToolUnavailable(
                f"this session has started {MAX_SESSION_CHILDREN} child sessions, its limit"
            )
        self.started += 1
        child = await self._create(turn, tool_id, title)
        run_id = f"r1-{secrets.token_hex(4)}"
        prompt_id = user_message_id(run_id)
        now = self._now_ms()
        item = TimelineItem(
            item_id=prompt_id, kind=ItemKind.USER, created_ms=now, run_id=run_id, text=prompt
        )
        await self._store.admit_user_message(child.id, item, now_ms=now)
        parent_run = outlet.run_id
        await outlet.send(ChildAnnounced(parent_run, child.id, tool_id, title, prompt, prompt_id))
        queue = _ChildQueue(outlet.queue, parent_run, child.id)
        run = self._child_run(run_id, child, turn, outlet, queue, prompt)
        # Until it has a place among the running, a cancel of this child alone ends its wait.
        waiting = trio.CancelScope()
        self._cancels[child.id] = waiting.cancel
        try:
            acquired = False
            with waiting:
                await slots.acquire()
                acquired = True
            if waiting.cancel_called:
                if acquired:
                    slots.release()
            else:
                try:
                    self._cancels[child.id] = run.cancel
                    self._running[child.id] = run
                    await outlet.send(ChildRunning(parent_run, child.id))
                    await run.drive(self._backend, on_end=_ignore_end)
                finally:
                    slots.release()
        finally:
            self._running.pop(child.id, None)
            self._cancels.pop(child.id, None)
            outcome = run.outcome
            if outcome is None:
                outcome = RunOutcome(state=RunState.CANCELLED)
            text = _answer(outcome, queue.answer)
            answer_id = queue.answer_id if outcome.state is RunState.COMPLETED else ""
            # Past the bound and without a wait: it must precede the parent's own end even
            # when the parent's turn is being cancelled.
            outlet.queue.put_retained(ChildEnded(parent_run, child.id, outcome, text, answer_id))
            logger.info(
                "child session %s of task %s ended: %s",
                child.id,
                child.parent_id,
                outcome.state.value,
            )
        return DelegationResult(
            child_id=child.id, state=outcome.state, text=text, stop_reason=outcome.stop_reason
        )

    async def _create(self, turn: Turn, tool_id: str, title: str) -> TaskRecord:
        parent = self._task()
        now = self._now_ms()
        child = TaskRecord(
            id=uuid.uuid4().hex,
            account=parent.account,
            root=parent.root,
            title=title,
            created_ms=now,
            updated_ms=now,
            policy=parent.policy,
            surface=parent.surface,
            model=self._model if self._model is not None else turn.model,
            # The parent's mode, read now: a child is never more permissive than its parent.
            mode=parent.mode,
            thought_level=parent.thought_level,
            additional_directories=parent.additional_directories,
            parent_id=parent.id,
            parent_tool_id=tool_id,
        )
        await self._store.create_task(child)
        return child

    def _child_run(
        self,
        run_id: str,
        child: TaskRecord,
        turn: Turn,
        outlet: RunOutlet,
        queue: _ChildQueue,
        prompt: str,
    ) -> Run:
        # The parent's policy, mode, directories and relay redaction; nothing a child reports
        # changes its parent's session (title, goal, commands).
        hooks = outlet.hooks
        child_hooks = type(hooks)(
            now_ms=hooks.now_ms,
            policy=hooks.policy,
            set_title=_keep_title,
            set_goal=_no_goal,
            redactor=hooks.redactor,
            set_commands=_ignore_commands,
            auto_title=_no_title,
            mode=hooks.mode,
            roots=hooks.roots,
            thought_level=hooks.thought_level,
            option_values=hooks.option_values,
        )
        model = child.model

        def make_turn(child_outlet: RunOutlet) -> Turn:
            return turn.child_turn(
                child_outlet, task_id=child.id, prompt=Prompt(prompt), model=model
            )

        return Run(
            run_id=run_id,
            task_id=child.id,
            kind=RunKind.PROMPT,
            hooks=child_hooks,
            store=self._store,
            make_turn=make_turn,
            queue=queue,
        )


class RunDelegation:
    """One run's delegations: its places among the running children."""

    def __init__(self, children: LeaseChildren) -> None:
        self._children = children
        self._slots = trio.Semaphore(MAX_RUNNING_CHILDREN)

    async def delegate(
        self, turn: Turn, outlet: RunOutlet, tool_id: str, title: str, prompt: str
    ) -> DelegationResult:
        return await self._children.delegate(self._slots, turn, outlet, tool_id, title, prompt)


class _ChildQueue(RunEventQueue):
    """A child run's event queue: each event goes to the parent run's queue as a
    ``ChildEvent``, waiting for room there; the child's last agent message is kept as its
    answer."""

    def __init__(self, parent: RunEventQueue, parent_run: str, child_id: str) -> None:
        super().__init__()
        self._parent = parent
        self._parent_run = parent_run
        self._child_id = child_id
        self.answer_id = ""
        self._answer: list[str] = []
        self._answer_chars = 0

    @property
    def answer(self) -> str:
        return "".join(self._answer)

    def _note(self, event: RunEvent) -> ChildEvent:
        if isinstance(event, TextChunk):
            if event.message_id != self.answer_id:
                self.answer_id, self._answer, self._answer_chars = event.message_id, [], 0
            if self._answer_chars <= MAX_ANSWER_CHARS:
                self._answer.append(event.text)
                self._answer_chars += len(event.text)
        self.sent += 1
        return ChildEvent(self._parent_run, self._child_id, event)

    async def send(self, event: RunEvent) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        await self._parent.send(self._note(event))

    def offer(self, event: RunEvent) -> bool:
        # Never at once: every event takes ``send``'s path into the parent's queue.
        return False

    def send_nowait(self, event: RunEvent) -> bool:
        return self._parent.send_nowait(self._note(event))

    def close(self, tail: list[RunEvent]) -> None:
        for event in tail:
            self._parent.put_retained(self._note(event))
        super().close([])


def _answer(outcome: RunOutcome, text: str) -> str:
    if outcome.state is RunState.FAILED:
        return f"the child session failed: {outcome.failure or 'no reason given'}"
    if outcome.state is RunState.CANCELLED:
        return CANCELLED_ANSWER
    if not text.strip():
        return EMPTY_ANSWER
    return text[:MAX_ANSWER_CHARS]


def _ignore_end(run: Run) -> None:
    """A child's end is told by its delegation, not by a callback."""


def _ignore_commands(commands: object) -> None:
    """A child's commands are not its parent's session's."""


async def _keep_title(title: str) -> None:
    """A child's title is the one its parent gave it."""


async def _no_title() -> str | None:
    return None


async def _no_goal(objective: str, budget: int | None) -> GoalRecord:
    raise RuntimeRejection(RejectionKind.GOAL_STATE, "a child session has no goal of its own")
