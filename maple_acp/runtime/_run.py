"""One run: a backend turn in its own cancel scope, its bounded ordered event stream, its
permission responders, and its retained terminal state."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

from maple_acp.model import GoalRecord, ItemKind, TimelineItem, ToolState, ToolStatus, Usage
from maple_acp.runtime._backend import AgentBackend, GoalProgress, TurnFailed
from maple_acp.runtime._errors import bounded_text
from maple_acp.runtime._events import (
    PermissionRequest,
    RunEnded,
    RunEvent,
    RunKind,
    RunNotice,
    RunOutcome,
    RunState,
    TextChunk,
    ThoughtChunk,
    TitleChanged,
    ToolRow,
    UsageUpdate,
)
from maple_acp.runtime._permissions import (
    PermissionBroker,
    PermissionClass,
    PermissionPolicy,
    ToolRequest,
    classify,
)
from maple_acp.runtime._tools import ToolContext
from maple_acp.runtime._trust import SkillInfo
from maple_acp.store import TaskStore

logger = logging.getLogger(__name__)

#: Events of one run waiting for its consumer. An awaited send waits for room (backpressure
#: on the backend); a send that cannot wait and finds no room cancels the run, because a
#: dropped event cannot be reconstructed.
RUN_EVENT_QUEUE = 256
#: A backend emitting into a queue with room checkpoints once per this many events.
EMIT_BATCH = 64
#: Text kept per message for the task history; a longer message is stored truncated (the live
#: events still carry all of it).
MAX_STORED_MESSAGE_CHARS = 1_000_000
#: Writing a run's final rows and usage after it ended, even when it was cancelled.
RUN_FINALIZE_BOUND_S = 5.0

OVERFLOW_NOTICE = "the run produced events faster than they were read; it was cancelled"
_TRUNCATION_MARK = "\n[truncated]"


class _Message:
    __slots__ = ("created_ms", "kind", "parts", "size", "truncated")

    def __init__(self, kind: ItemKind, created_ms: int) -> None:
        self.kind = kind
        self.created_ms = created_ms
        self.parts: list[str] = []
        self.size = 0
        self.truncated = False

    def add(self, text: str) -> None:
        if self.truncated:
            return
        room = MAX_STORED_MESSAGE_CHARS - self.size
        if len(text) > room:
            self.parts.append(text[:room])
            self.size = MAX_STORED_MESSAGE_CHARS
            self.truncated = True
        else:
            self.parts.append(text)
            self.size += len(text)

    def text(self) -> str:
        joined = "".join(self.parts)
        return joined + _TRUNCATION_MARK if self.truncated else joined


class Turn:
    """The backend's view of one run: what to do, and where to report it.

    Every ``send_*``/report method is ordered with the others. The awaited ones wait for room
    in the run's event queue (this is how a slow consumer slows the backend); the one ``*_nowait``
    method is for producers that cannot wait, and cancels the run if the queue is full.
    """

    def __init__(
        self,
        run: Run,
        *,
        prompt: str,
        model: str | None,
        root: str,
        skills: tuple[SkillInfo, ...],
        goal: GoalRecord | None,
        tools: ToolContext,
    ) -> None:
        self._run = run
        self.run_id = run.id
        self.task_id = run.task_id
        self.kind = run.kind
        #: The prompt text (joined by the caller), or the goal objective for a goal cycle.
        self.prompt = prompt
        self.model = model
        #: The task's canonical project directory.
        self.root = root
        #: Project skills visible to the model: empty unless the project is trusted.
        self.skills = skills
        #: The task's goal when the turn started.
        self.goal = goal
        self.tools = tools
        #: Set by a goal cycle to say how the goal stands after it.
        self.goal_progress: GoalProgress | None = None

    def new_message_id(self) -> str:
        return self._run._next_id("m")

    async def send_text(self, text: str, *, message_id: str | None = None) -> str:
        """Agent message text; returns the message id used (the current text message unless
        one is given or another kind of event came in between)."""
        event = self._run._text_event(ItemKind.ASSISTANT, text, message_id)
        await self._run._emit(event)
        return event.message_id

    def send_text_nowait(self, text: str, *, message_id: str | None = None) -> str:
        """``send_text`` for a producer that cannot wait: if the queue is full the run is
        cancelled with a terminal notice instead."""
        event = self._run._text_event(ItemKind.ASSISTANT, text, message_id)
        self._run._emit_nowait(event)
        return event.message_id

    async def send_thought(self, text: str, *, message_id: str | None = None) -> str:
        event = self._run._text_event(ItemKind.THOUGHT, text, message_id)
        await self._run._emit(event)
        return event.message_id

    async def send_tool_row(self, tool_id: str, tool: ToolState) -> None:
        """Report a tool call's state; the first row of an id opens the call, later rows update
        it. Rows are also written to the task history."""
        await self._run._tool_row(tool_id, tool)

    async def ask_permission(self, request: ToolRequest) -> bool:
        """Ask whether ``request`` may run. Allowed by the host policy: True at once. Otherwise
        the run's caller answers; a deny, a cancellation or any invalid answer is False (the
        invalid ones also cancel the run)."""
        return await self._run._ask_permission(request)

    async def report_usage(self, usage: Usage) -> None:
        """Add token usage to this run's total."""
        run = self._run
        run._usage = run._usage + usage
        await run._emit(UsageUpdate(run.id, run._usage))

    async def set_title(self, title: str) -> None:
        title = bounded_text(title, 200)
        await self._run._hooks.set_title(title)
        await self._run._emit(TitleChanged(self.run_id, title))

    async def notice(self, text: str) -> None:
        await self._run._emit(RunNotice(self.run_id, bounded_text(text)))

    async def set_goal(self, objective: str, *, token_budget: int | None = None) -> GoalRecord:
        """Give the task a (new) active goal, as a caller's ``set`` would."""
        return await self._run._hooks.set_goal(objective, token_budget)


class RunHooks:
    """What a run needs from its lease, kept narrow so a run never reaches past it."""

    def __init__(
        self,
        *,
        store: TaskStore,
        now_ms: Callable[[], int],
        policy: PermissionPolicy,
        set_title: Callable[[str], Awaitable[None]],
        set_goal: Callable[[str, int | None], Awaitable[GoalRecord]],
    ) -> None:
        self.store = store
        self.now_ms = now_ms
        self.policy = policy
        self.set_title = set_title
        self.set_goal = set_goal


class Run:
    """A handle on one run. Read ``events()`` (exactly once) until ``RunEnded``; ``cancel()``;
    ``await wait()`` for the retained outcome; answer permission requests with ``answer``."""

    def __init__(self, *, run_id: str, task_id: str, kind: RunKind, hooks: RunHooks) -> None:
        self.id = run_id
        self.task_id = task_id
        self.kind = kind
        self._hooks = hooks
        self._scope = trio.CancelScope()
        self._send, self._receive = trio.open_memory_channel[RunEvent](RUN_EVENT_QUEUE)
        self._tail: list[RunEvent] = []
        self._done = trio.Event()
        self._outcome: RunOutcome | None = None
        self._broker = PermissionBroker(run_id, self.cancel)
        self._usage = Usage()
        self._overflowed = False
        self._unyielded = 0
        self._events_taken = False
        self._ids = 0
        self._messages: dict[str, _Message] = {}
        self._tools: dict[str, ToolState] = {}
        self._emitted: dict[str, ToolState] = {}
        self._item_order: list[str] = []
        self._dirty: set[str] = set()
        self._current: tuple[ItemKind, str] | None = None
        self.turn: Turn | None = None

    # -- the caller's side -------------------------------------------------------------------

    def events(self) -> AsyncIterator[RunEvent]:
        """The run's ordered events, ending with ``RunEnded``. Can be taken once."""
        if self._events_taken:
            raise RuntimeError("a run's events can be read only once")
        self._events_taken = True
        return _RunEvents(self)

    def cancel(self) -> None:
        """Cancel this exact run; every pending permission request resolves as denied.
        Idempotent; no effect on an ended run."""
        self._broker.close()
        self._scope.cancel()

    def answer(self, responder_id: str, answer: str) -> bool:
        """Answer one of this run's permission requests with ``"allow_once"`` or
        ``"deny_once"``. True if accepted. An unknown or reused id, an id of another run, an
        unknown answer, or any answer after cancellation denies every pending request of this
        run, cancels it, and returns False."""
        return self._broker.answer(responder_id, answer)

    async def wait(self) -> RunOutcome:
        await self._done.wait()
        assert self._outcome is not None
        return self._outcome

    @property
    def outcome(self) -> RunOutcome | None:
        return self._outcome

    @property
    def ended(self) -> bool:
        return self._done.is_set()

    @property
    def usage(self) -> Usage:
        """This run's usage so far."""
        return self._usage

    @property
    def pending_permissions(self) -> tuple[str, ...]:
        return tuple(self._broker.pending_ids)

    # -- driving -----------------------------------------------------------------------------

    async def drive(
        self,
        backend: AgentBackend,
        *,
        on_end: Callable[[Run], None],
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the backend turn. Returns (never raises for the turn's own failure or
        cancellation) once the outcome is retained and the final rows are written; an outer
        cancellation still propagates after that."""
        assert self.turn is not None
        state: RunState | None = None
        failure: str | None = None
        try:
            with self._scope:
                task_status.started()
                try:
                    await backend.run_turn(self.turn)
                    state = RunState.COMPLETED
                except TurnFailed as exc:
                    state, failure = RunState.FAILED, bounded_text(str(exc))
                except Exception as exc:
                    failed = _turn_failure(exc)
                    if failed is None:
                        logger.warning("agent backend raised in run %s", self.id, exc_info=True)
                        failure = bounded_text(f"the agent backend failed: {type(exc).__name__}")
                    else:
                        failure = failed
                    state = RunState.FAILED
        finally:
            if state is None or self._overflowed:
                state = RunState.CANCELLED
                failure = None
            self._broker.close()
            with trio.CancelScope(shield=True):
                with trio.move_on_after(RUN_FINALIZE_BOUND_S):
                    await self._finalize(state, failure)
                self._outcome = RunOutcome(
                    state=state, failure=failure, usage=self._usage, overflowed=self._overflowed
                )
                if self._overflowed:
                    self._tail.append(RunNotice(self.id, OVERFLOW_NOTICE, terminal=True))
                if failure is not None:
                    self._tail.append(RunNotice(self.id, failure, terminal=True))
                self._tail.append(RunEnded(self.id, self._outcome))
                self._send.close()
                self._done.set()
                on_end(self)

    async def _finalize(self, state: RunState, failure: str | None) -> None:
        closing = {
            RunState.CANCELLED: ToolStatus.CANCELLED,
            RunState.FAILED: ToolStatus.FAILED,
            RunState.COMPLETED: ToolStatus.FAILED,
        }[state]
        for tool_id, tool in list(self._tools.items()):
            if not tool.status.terminal:
                tool = ToolState(
                    name=tool.name,
                    status=closing,
                    title=tool.title,
                    raw_input=tool.raw_input,
                    output_text=failure or f"the tool call ended {closing.value}",
                    locations=tool.locations,
                )
                self._tools[tool_id] = tool
                self._dirty.add(tool_id)
            if self._emitted.get(tool_id) is not tool:
                # The caller must see every tool's final state, even when the run was
                # cancelled between writing that state and sending it.
                first = tool_id not in self._emitted
                self._tail.append(ToolRow(self.id, tool_id, first, tool))
        try:
            await self._flush()
            if self._usage != Usage() or self.kind is RunKind.PROMPT:
                await self._hooks.store.record_usage(self.task_id, self.id, self._usage)
        except Exception:
            logger.warning("could not write the final rows of run %s", self.id, exc_info=True)

    # -- the backend's side (through Turn) ---------------------------------------------------

    def _next_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{self.id}-{prefix}{self._ids}"

    def _text_event(
        self, kind: ItemKind, text: str, message_id: str | None
    ) -> TextChunk | ThoughtChunk:
        current = self._current
        if message_id is None:
            if current is not None and current[0] is kind:
                message_id = current[1]
            else:
                message_id = self._next_id("m")
        message = self._messages.get(message_id)
        if message is None:
            message = self._messages[message_id] = _Message(kind, self._hooks.now_ms())
            self._item_order.append(message_id)
        message.add(text)
        self._dirty.add(message_id)
        self._current = (kind, message_id)
        if kind is ItemKind.THOUGHT:
            return ThoughtChunk(self.id, message_id, text)
        return TextChunk(self.id, message_id, text)

    async def _emit(self, event: RunEvent) -> None:
        # While the queue has room the event goes in without a scheduler pass, so a streaming
        # backend hands over events in batches; only a full queue makes it wait (that wait is
        # the backpressure), and every EMIT_BATCH events it checkpoints anyway, so that a
        # cancelled backend stops within one batch.
        # A cancelled backend must not go on emitting for the rest of a batch.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            with contextlib.suppress(trio.ClosedResourceError):
                await self._send.send(event)
            self._unyielded = 0
            return
        except trio.ClosedResourceError:
            return
        self._unyielded += 1
        if self._unyielded >= EMIT_BATCH:
            self._unyielded = 0
            await trio.lowlevel.checkpoint()

    def _emit_nowait(self, event: RunEvent) -> None:
        if self._overflowed:
            return
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            logger.warning("event queue of run %s overflowed; cancelling it", self.id)
            self._overflowed = True
            self.cancel()
        except trio.ClosedResourceError:
            pass

    async def _tool_row(self, tool_id: str, tool: ToolState) -> None:
        first = tool_id not in self._emitted
        if tool_id not in self._tools:
            self._item_order.append(tool_id)
        self._tools[tool_id] = tool
        self._dirty.add(tool_id)
        self._current = None
        # Written at once, with the text before it, so a crash keeps the history ordered.
        await self._flush()
        await self._emit(ToolRow(self.id, tool_id, first, tool))
        self._emitted[tool_id] = tool

    async def _ask_permission(self, request: ToolRequest) -> bool:
        if classify(self._hooks.policy, request) is PermissionClass.ALLOW:
            return True
        responder = self._broker.open_request()
        self._current = None
        await self._emit(PermissionRequest(self.id, responder, request))
        return await self._broker.wait(responder)

    async def _flush(self) -> None:
        if not self._dirty:
            return
        now = self._hooks.now_ms()
        items: list[TimelineItem] = []
        for item_id in self._item_order:
            if item_id not in self._dirty:
                continue
            message = self._messages.get(item_id)
            if message is not None:
                items.append(
                    TimelineItem(
                        item_id=item_id,
                        kind=message.kind,
                        created_ms=message.created_ms,
                        run_id=self.id,
                        text=message.text(),
                    )
                )
            else:
                tool = self._tools[item_id]
                items.append(
                    TimelineItem(
                        item_id=item_id,
                        kind=ItemKind.TOOL,
                        created_ms=now,
                        run_id=self.id,
                        text=tool.title or tool.name,
                        tool=tool,
                    )
                )
        self._dirty.clear()
        await self._hooks.store.upsert_items(self.task_id, items, now_ms=now)


def _turn_failure(exc: Exception) -> str | None:
    """The text of a ``TurnFailed`` raised inside a backend's own nursery (so wrapped in an
    exception group), if there is one."""
    if isinstance(exc, BaseExceptionGroup):
        match = exc.subgroup(TurnFailed)
        if match is not None:
            first: Any = match
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            return bounded_text(str(first))
    return None


class _RunEvents:
    """Async iterator over a run's queued events, then its retained terminal events."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self._tail_index: int | None = None

    def __aiter__(self) -> _RunEvents:
        return self

    async def __anext__(self) -> RunEvent:
        if self._tail_index is None:
            try:
                # Queued events are taken without a scheduler pass each; the consumer waits
                # only when the queue is empty.
                try:
                    return self._run._receive.receive_nowait()
                except trio.WouldBlock:
                    return await self._run._receive.receive()
            except trio.EndOfChannel:
                self._tail_index = 0
        tail = self._run._tail
        if self._tail_index < len(tail):
            event = tail[self._tail_index]
            self._tail_index += 1
            return event
        raise StopAsyncIteration
