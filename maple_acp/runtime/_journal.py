"""A run's share of the task history: its messages and tool rows, written in order."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from maple_acp._text import CUT_TEXT, truncate
from maple_acp.model import ItemKind, PlanEntry, TimelineItem, ToolState, ToolStatus, Usage
from maple_acp.runtime._events import RunState, ToolRow
from maple_acp.store import TaskStore

#: Text kept per message for the task history; a longer message is stored truncated (the live
#: events still carry all of it).
MAX_STORED_MESSAGE_CHARS = 1_000_000


#: How a tool still open when its run ends is closed, per run outcome.
_CLOSING = {
    RunState.CANCELLED: ToolStatus.CANCELLED,
    RunState.FAILED: ToolStatus.FAILED,
    RunState.COMPLETED: ToolStatus.FAILED,
}


#: A thought's provider signature longer than this is not kept (the thought is then stored
#: unsigned): real ones are a few kilobytes, and the history must stay bounded.
MAX_SIGNATURE_CHARS = 65_536


class _Message:
    __slots__ = ("created_ms", "kind", "parts", "signature", "size", "truncated")

    def __init__(self, kind: ItemKind, created_ms: int) -> None:
        self.kind = kind
        self.created_ms = created_ms
        self.parts: list[str] = []
        self.size = 0
        self.truncated = False
        self.signature: str | None = None

    def add(self, text: str) -> None:
        if self.truncated:
            return
        # One character past the limit is kept, so that text() knows it must cut.
        room = MAX_STORED_MESSAGE_CHARS + 1 - self.size
        if len(text) >= room:
            self.parts.append(text[:room])
            self.size += min(room, len(text))
            self.truncated = self.size > MAX_STORED_MESSAGE_CHARS
        else:
            self.parts.append(text)
            self.size += len(text)

    def text(self) -> str:
        return truncate("".join(self.parts), MAX_STORED_MESSAGE_CHARS, CUT_TEXT)


class RunJournal:
    """What one run adds to its task's history. Message text accumulates in memory and is
    written when a tool row (or the run's end) follows it, so the history keeps the order the
    caller saw; tool rows are written at once."""

    def __init__(
        self, *, run_id: str, task_id: str, store: TaskStore, now_ms: Callable[[], int]
    ) -> None:
        self.run_id = run_id
        self.task_id = task_id
        self._store = store
        self._now_ms = now_ms
        self._ids = 0
        self._messages: dict[str, _Message] = {}
        self._tools: dict[str, ToolState] = {}
        #: Each plan row: its checklist and its Markdown (one of them, or neither: cleared).
        self._plans: dict[str, tuple[tuple[PlanEntry, ...], str]] = {}
        self._emitted: dict[str, ToolState] = {}
        self._order: list[str] = []
        self._dirty: set[str] = set()
        #: Tool calls that outlive the run (background commands): their own task ends them.
        self._detached: set[str] = set()
        self._current: tuple[ItemKind, str] | None = None
        # Writes go one at a time, so a steering message lands after what came before it.
        self._writing = trio.Lock()

    def next_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{self.run_id}-{prefix}{self._ids}"

    def add_text(self, kind: ItemKind, text: str, message_id: str | None) -> str:
        """Record message text; returns its message id (the current message of that kind
        unless ``message_id`` is given or something else came in between)."""
        current = self._current
        if (
            current is not None
            and current[0] is kind
            and (message_id is None or message_id == current[1])
        ):
            # The streaming hot path: more text for the current message (named again or not).
            self._messages[current[1]].add(text)
            self._dirty.add(current[1])
            return current[1]
        if message_id is None:
            message_id = self.next_id("m")
        message = self._messages.get(message_id)
        if message is None:
            message = self._messages[message_id] = _Message(kind, self._now_ms())
            self._order.append(message_id)
        message.add(text)
        self._dirty.add(message_id)
        self._current = (kind, message_id)
        return message_id

    def sign_thought(self, message_id: str, signature: str) -> bool:
        """Keep the provider's ``signature`` with thought ``message_id`` (written with it).
        False, and nothing kept, for an unknown id, a message that is not a thought, a
        truncated thought (its text is no longer what was signed) or an overlong signature."""
        message = self._messages.get(message_id)
        if (
            message is None
            or message.kind is not ItemKind.THOUGHT
            or message.truncated
            or not signature
            or len(signature) > MAX_SIGNATURE_CHARS
        ):
            return False
        message.signature = signature
        self._dirty.add(message_id)
        return True

    def interrupt(self) -> None:
        """Something other than text came: the next text starts a new message."""
        self._current = None

    def add_tool(self, tool_id: str, tool: ToolState) -> bool:
        """Record a tool row; True if it is the first row of ``tool_id`` the caller will see."""
        if tool_id not in self._tools:
            self._order.append(tool_id)
        self._tools[tool_id] = tool
        self._dirty.add(tool_id)
        self._current = None
        return tool_id not in self._emitted

    def add_plan(self, entries: tuple[PlanEntry, ...], markdown: str = "") -> None:
        """Record a whole plan as a new history row (the latest one of a task wins); a
        Markdown plan is the row's text."""
        plan_id = self.next_id("p")
        self._order.append(plan_id)
        self._plans[plan_id] = (entries, markdown)
        self._dirty.add(plan_id)
        self._current = None

    def detach_tool(self, tool_id: str) -> None:
        """The tool call goes on past the run: the run's end leaves it open."""
        self._detached.add(tool_id)

    def tool_emitted(self, tool_id: str, tool: ToolState) -> None:
        self._emitted[tool_id] = tool

    def close_open_tools(self, state: RunState, failure: str | None) -> list[ToolRow]:
        """End every tool still open when the run ended; returns the rows the caller has not
        seen yet (every tool's final state must reach it, even after a cancellation)."""
        closing = _CLOSING[state]
        rows: list[ToolRow] = []
        for tool_id, tool in list(self._tools.items()):
            if tool_id in self._detached:
                continue
            if not tool.status.terminal:
                tool = attrs.evolve(
                    tool,
                    status=closing,
                    output_text=failure or f"the tool call ended {closing.value}",
                )
                self._tools[tool_id] = tool
                self._dirty.add(tool_id)
            if self._emitted.get(tool_id) is not tool:
                rows.append(ToolRow(self.run_id, tool_id, tool_id not in self._emitted, tool))
        return rows

    async def flush(self) -> None:
        """Write what changed since the last flush, in the order it happened."""
        if not self._dirty:
            return
        async with self._writing:
            await self._flush_locked()

    async def admit_user(self, item: TimelineItem) -> None:
        """Write a user message that arrived while the run works (steering), after everything
        the run said before it; the run's next text starts a new message."""
        async with self._writing:
            self._current = None
            await self._flush_locked()
            await self._store.admit_user_message(self.task_id, item, now_ms=item.created_ms)

    async def _flush_locked(self) -> None:
        if not self._dirty:
            return
        now = self._now_ms()
        items: list[TimelineItem] = []
        for item_id in self._order:
            if item_id not in self._dirty:
                continue
            message = self._messages.get(item_id)
            plan = self._plans.get(item_id)
            if plan is not None:
                items.append(
                    TimelineItem(
                        item_id=item_id,
                        kind=ItemKind.PLAN,
                        created_ms=now,
                        run_id=self.run_id,
                        plan=plan[0],
                        text=plan[1],
                    )
                )
            elif message is not None:
                items.append(
                    TimelineItem(
                        item_id=item_id,
                        kind=message.kind,
                        created_ms=message.created_ms,
                        run_id=self.run_id,
                        text=message.text(),
                        signature=message.signature,
                    )
                )
            else:
                tool = self._tools[item_id]
                items.append(
                    TimelineItem(
                        item_id=item_id,
                        kind=ItemKind.TOOL,
                        created_ms=now,
                        run_id=self.run_id,
                        text=tool.title or tool.name,
                        tool=tool,
                    )
                )
        self._dirty.clear()
        await self._store.upsert_items(self.task_id, items, now_ms=now)

    async def keep_transcript(self, body: bytes) -> None:
        """Write what is pending, then keep ``body`` as covering this run's items so far."""
        async with self._writing:
            await self._flush_locked()
            await self._store.put_transcript(self.task_id, self.run_id, body)

    async def transcripts(self) -> dict[str, bytes]:
        return await self._store.transcripts(self.task_id)

    async def record_usage(self, usage: Usage) -> None:
        await self._store.record_usage(self.task_id, self.run_id, usage)
