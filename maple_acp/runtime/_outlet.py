"""The backend's side of one run: the narrow surface through which a ``Turn`` reports."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

import attrs

from maple_acp._text import one_line
from maple_acp.model import (
    CommandInfo,
    GoalRecord,
    ItemKind,
    PlanEntry,
    ToolState,
    ToolStatus,
    Usage,
)
from maple_acp.runtime._event_queue import RunEventQueue
from maple_acp.runtime._events import (
    CommandsChanged,
    CompactionChanged,
    CompactionText,
    PermissionRequest,
    PlanUpdated,
    RunEvent,
    TextChunk,
    ThoughtChunk,
    ToolRow,
    UsageUpdate,
)
from maple_acp.runtime._journal import RunJournal
from maple_acp.runtime._modes import ModeDecision, ModeDeclaration
from maple_acp.runtime._permissions import (
    PermissionBroker,
    PermissionClass,
    PermissionPolicy,
    ToolRequest,
    classify,
)
from maple_acp.runtime._relay import RelayRedactor
from maple_acp.runtime._steering import SteeringInbox
from maple_acp.runtime._tool_rows import prepared_request, prepared_tool

logger = logging.getLogger(__name__)

#: A tool name in a log line, at most (names come from backends and MCP servers).
MAX_LOGGED_NAME_CHARS = 64
#: The text of a tool row whose permission question the turn's cancellation ended.
CANCELLED_ASK = "cancelled"


@attrs.frozen(kw_only=True)
class RunHooks:
    """What a run needs from its lease, kept narrow so a run never reaches past it."""

    now_ms: Callable[[], int]
    policy: PermissionPolicy
    set_title: Callable[[str], Awaitable[None]]
    set_goal: Callable[[str, int | None], Awaitable[GoalRecord]]
    #: The lease's relay values, replaced in every tool row and permission request.
    redactor: RelayRedactor
    #: The backend's commands changed (the lease keeps the latest list).
    set_commands: Callable[[tuple[CommandInfo, ...]], None]
    #: At the end of a prompt run: the title the runtime gave an untitled task, if any.
    auto_title: Callable[[], Awaitable[str | None]]
    #: The session's mode now (read at each decision: a change applies from the next call).
    mode: Callable[[], ModeDeclaration]
    #: The session's directories (the task's root first), for the mode's edit rule.
    roots: tuple[str, ...]
    #: The thinking effort chosen for the task now, if any.
    thought_level: Callable[[], str | None]
    #: The task's boolean options now (each declared one, set or default).
    option_values: Callable[[], Mapping[str, bool]]


class RunOutlet:
    """Where one run's reports go: the event queue, the history journal and the permission
    broker, in the order the backend made them. A ``Turn`` holds only this."""

    def __init__(
        self,
        *,
        run_id: str,
        queue: RunEventQueue,
        journal: RunJournal,
        broker: PermissionBroker,
        hooks: RunHooks,
        cancel_run: Callable[[], None],
        steering: SteeringInbox | None = None,
    ) -> None:
        self.run_id = run_id
        #: The user's steering messages for the backend (``Turn.steering()``).
        self.steering = steering if steering is not None else SteeringInbox()
        self.hooks = hooks
        self._queue = queue
        self._journal = journal
        self._broker = broker
        self._cancel_run = cancel_run
        self._usage = Usage()
        self._usage_reported = False
        self._overflowed = False
        #: Tool calls whose permission question ended with the run, not with an answer.
        self._cancelled_asks: set[str] = set()
        #: Running compactions and their summary so far (stored only once one completes).
        self._compactions: dict[str, list[str]] = {}

    @property
    def usage(self) -> Usage:
        return self._usage

    @property
    def queue(self) -> RunEventQueue:
        """The run's event queue, for the child sessions it delegates to (``_children``)."""
        return self._queue

    @property
    def overflowed(self) -> bool:
        """A send that could not wait found the queue full, and the run was cancelled."""
        return self._overflowed

    def next_id(self, prefix: str) -> str:
        return self._journal.next_id(prefix)

    async def send(self, event: RunEvent) -> None:
        await self._queue.send(event)

    async def send_text(self, kind: ItemKind, text: str, message_id: str | None) -> str:
        message_id, pending = self.put_text(kind, text, message_id)
        if pending is not None:
            await self._queue.send(pending)
        return message_id

    def put_text(
        self, kind: ItemKind, text: str, message_id: str | None
    ) -> tuple[str, TextChunk | ThoughtChunk | None]:
        """The streaming hot path, without a coroutine of its own: record the text and queue
        its event if the queue takes it at once. Returns the message id, and the event still
        to be sent with ``await send(...)`` (a wait or a scheduler pass is due) or None."""
        message_id = self._journal.add_text(kind, text, message_id)
        if kind is ItemKind.THOUGHT:
            event: TextChunk | ThoughtChunk = ThoughtChunk(self.run_id, message_id, text)
        else:
            event = TextChunk(self.run_id, message_id, text)
        if self._queue.offer(event):
            return message_id, None
        return message_id, event

    def sign_thought(self, message_id: str, signature: str) -> bool:
        return self._journal.sign_thought(message_id, signature)

    async def keep_transcript(self, body: bytes) -> None:
        await self._journal.keep_transcript(body)

    async def transcripts(self) -> dict[str, bytes]:
        return await self._journal.transcripts()

    def send_text_nowait(self, kind: ItemKind, text: str, message_id: str | None) -> str:
        event = self._text_event(kind, text, message_id)
        if not self._overflowed and not self._queue.send_nowait(event):
            logger.warning("event queue of run %s overflowed; cancelling it", self.run_id)
            self._overflowed = True
            self._cancel_run()
        return event.message_id

    def _text_event(
        self, kind: ItemKind, text: str, message_id: str | None
    ) -> TextChunk | ThoughtChunk:
        message_id = self._journal.add_text(kind, text, message_id)
        if kind is ItemKind.THOUGHT:
            return ThoughtChunk(self.run_id, message_id, text)
        return TextChunk(self.run_id, message_id, text)

    async def send_tool_row(self, tool_id: str, tool: ToolState) -> None:
        if tool_id in self._cancelled_asks and tool.status is ToolStatus.FAILED:
            tool = attrs.evolve(tool, status=ToolStatus.CANCELLED, output_text=CANCELLED_ASK)
        tool = prepared_tool(tool, self.hooks.redactor)
        first = self._journal.add_tool(tool_id, tool)
        # Written at once, with the text before it, so a crash keeps the history ordered.
        await self._journal.flush()
        await self._queue.send(ToolRow(self.run_id, tool_id, first, tool))
        self._journal.tool_emitted(tool_id, tool)

    def detach_tool(self, tool_id: str) -> None:
        """Tool call ``tool_id`` outlives the run (a background command ends it)."""
        self._journal.detach_tool(tool_id)

    async def ask_permission(self, request: ToolRequest) -> bool:
        # The mode first, on the request as the backend made it (its real target path): what
        # the mode forbids is never put to the host's policy or the caller.
        mode = self.hooks.mode()
        decision = mode.decide(request, self.hooks.roots)
        request = prepared_request(request, self.hooks.redactor)
        if decision is ModeDecision.REFUSE:
            self._log_decision(request, f"refused by the session's {mode.mode.id} mode")
            return False
        if decision is ModeDecision.ALLOW:
            self._log_decision(request, f"allowed by the session's {mode.mode.id} mode")
            return True
        if classify(self.hooks.policy, request) is PermissionClass.ALLOW:
            self._log_decision(request, "allowed by the host policy")
            return True
        responder = self._broker.open_request()
        self._journal.interrupt()
        allowed = False
        try:
            await self._queue.send(PermissionRequest(self.run_id, responder, request))
            allowed = await self._broker.wait(responder)
        finally:
            if responder.cancelled:
                # Nobody said no: the turn was cancelled while the question was open. The
                # backend's "denied" row for this call is shown as cancelled instead.
                self._cancelled_asks.add(request.tool_id)
            outcome = "cancelled" if responder.cancelled else "denied"
            self._log_decision(request, "allowed once" if allowed else outcome)
        return allowed

    def _log_decision(self, request: ToolRequest, outcome: str) -> None:
        name = one_line(request.name, MAX_LOGGED_NAME_CHARS)
        logger.info("permission for tool %s in run %s: %s", name, self.run_id, outcome)

    async def send_plan(self, entries: tuple[PlanEntry, ...], markdown: str = "") -> None:
        self._journal.add_plan(entries, markdown)
        # Written at once, like a tool row: the latest plan is part of the replayed history.
        await self._journal.flush()
        await self._queue.send(PlanUpdated(self.run_id, entries, markdown))

    async def send_commands(self, commands: tuple[CommandInfo, ...]) -> None:
        self.hooks.set_commands(commands)
        await self._queue.send(CommandsChanged(self.run_id, commands))

    async def start_compaction(self) -> str:
        compaction_id = self.next_id("c")
        self._journal.interrupt()
        self._compactions[compaction_id] = []
        await self._queue.send(CompactionChanged(self.run_id, compaction_id, "in_progress"))
        return compaction_id

    async def send_compaction_text(self, compaction_id: str, text: str) -> None:
        parts = self._compactions.get(compaction_id)
        if parts is None:
            raise ValueError("no such compaction is running")
        parts.append(text)
        await self._queue.send(CompactionText(self.run_id, compaction_id, text))

    async def end_compaction(self, compaction_id: str, error: str | None) -> str | None:
        """End a running compaction; a completed one's summary is written to the history at
        once (the next request of a later turn is built from it). Returns the summary."""
        parts = self._compactions.pop(compaction_id, None)
        if parts is None:
            raise ValueError("no such compaction is running")
        summary = "".join(parts)
        if error is None and summary.strip():
            self._journal.add_text(ItemKind.COMPACTION, summary, compaction_id)
            self._journal.interrupt()
            await self._journal.flush()
            await self._queue.send(CompactionChanged(self.run_id, compaction_id, "completed"))
            return summary
        error = error or "the summary was empty"
        await self._queue.send(CompactionChanged(self.run_id, compaction_id, "failed", error))
        return None

    def open_compactions(self) -> list[CompactionChanged]:
        """What ends the compactions still running when the run ends: each is cancelled."""
        ended = [CompactionChanged(self.run_id, cid, "cancelled") for cid in self._compactions]
        self._compactions.clear()
        return ended

    @property
    def usage_reported(self) -> bool:
        """The backend reported usage at least once (zeros are counts only then)."""
        return self._usage_reported

    async def add_usage(self, usage: Usage) -> None:
        self._usage_reported = True
        self._usage = self._usage + usage
        await self._queue.send(UsageUpdate(self.run_id, self._usage))
