"""Runtime events and stored history as typed ``session/update`` notifications (sans-I/O).

One :class:`SessionProjector` per session keeps the only state projection needs: which tool
ids were already announced, so the first row of a tool id becomes ``tool_call`` and every
later row ``tool_call_update`` — for live runs and history replay alike.

Every update is a :class:`~maple_acp.wire.SessionNotification` except text chunks, the
streaming hot path: those are complete pre-encoded lines built from a template (the typed
line of the same message with the text cut out), so a chunk costs one ``orjson.dumps`` of its
text. The template is derived from the typed path, never written by hand, and a test checks
that both give the same bytes.

This module is the projector: how runtime events and stored history rows become v1
``session/update`` notifications (the v2 dialect builds on it).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Sequence
from typing import Any, Final

import orjson

from maple_acp import wire
from maple_acp._text import CUT_DIFF, truncate
from maple_acp.edge._bounds import (
    MAX_TOOL_TEXT_CHARS,
    bound_raw,
    bound_text,
    infer_tool_kind,
    tool_locations,
)
from maple_acp.edge._dialect import ImageSlot, Outbound, SessionSettings
from maple_acp.model import (
    CommandInfo,
    FileDiff,
    GoalRecord,
    ImageRef,
    ItemKind,
    MessageRow,
    PlanEntry,
    PlanStatus,
    TimelineItem,
    ToolState,
    ToolStatus,
)
from maple_acp.rpc import encode_notification
from maple_acp.runtime import MAX_PLAN_ENTRIES, ShellOutput, describe_image
from maple_acp.wire import (
    GOAL_CONTROL_METHOD,
    AgentMessageChunk,
    AgentThoughtChunk,
    AvailableCommand,
    AvailableCommandsUpdate,
    ChunkKind,
    CompactionStatus,
    CompactionSummaryChunk,
    CompactionUpdate,
    ConfigOptionUpdate,
    Content,
    CurrentModeUpdate,
    Diff,
    GoalSnapshot,
    ImageContent,
    Notice,
    NoticeSeverity,
    Plan,
    PlanItems,
    PlanMarkdown,
    PlanRemoved,
    PlanUpdate,
    PlanUpdateContent,
    SessionConfigOption,
    SessionInfoUpdate,
    SessionMode,
    SessionModeState,
    SessionNotification,
    SessionUpdate,
    TextContent,
    ToolCall,
    ToolCallContent,
    ToolCallStatus,
    ToolCallUpdate,
    UnstructuredCommandInput,
    UsageUpdate,
    UserMessageChunk,
    goal_info_update,
    unstructure,
)

#: The notification every update travels in.
UPDATE_METHOD: Final = "session/update"
#: Marker appended to a diff whose text was cut before it reached the edge.
DIFF_TRUNCATED: Final = CUT_DIFF
#: Titles and notices are short by nature; a longer one is cut.
MAX_TITLE_CHARS: Final = 500
#: The id of a session's plan: a session has one plan, and each update replaces it whole.
PLAN_ID: Final = "plan"

_STATUS: Final[dict[ToolStatus, ToolCallStatus]] = {
    ToolStatus.PENDING: "pending",
    ToolStatus.IN_PROGRESS: "in_progress",
    ToolStatus.COMPLETED: "completed",
    ToolStatus.FAILED: "failed",
    # ACP has no "cancelled" tool status; a cancelled call did not complete.
    ToolStatus.CANCELLED: "failed",
}
_CHUNK_KIND: Final[dict[ItemKind, ChunkKind]] = {
    ItemKind.USER: "user_message_chunk",
    ItemKind.ASSISTANT: "agent_message_chunk",
    ItemKind.THOUGHT: "agent_thought_chunk",
}
_CHUNK_TYPES: Final[
    dict[str, type[UserMessageChunk] | type[AgentMessageChunk] | type[AgentThoughtChunk]]
] = {
    "user_message_chunk": UserMessageChunk,
    "agent_message_chunk": AgentMessageChunk,
    "agent_thought_chunk": AgentThoughtChunk,
}
#: Stand in for the text and the message id while a template is cut from a typed line; NUL
#: never occurs in a session id we issue, and a template is used only when each marker occurs
#: exactly once, text first.
_TEXT_MARK: Final = "\x00text\x00"
_ID_MARK: Final = "\x00id\x00"
_TEXT_MARK_JSON: Final = orjson.dumps(_TEXT_MARK)
_ID_MARK_JSON: Final = orjson.dumps(_ID_MARK)

#: A text chunk's line in three parts: ``head + dumps(text) + middle + dumps(id) + tail``.
TextTemplate = tuple[bytes, bytes, bytes]


def _pieces(text: str) -> Iterator[str]:
    """Long text as consecutive pieces of at most :data:`MAX_TOOL_TEXT_CHARS` characters.

    Message text is split rather than cut: every piece goes out under the same message id, so
    the client sees the whole message while no single frame carries more than the bound."""
    if len(text) <= MAX_TOOL_TEXT_CHARS:
        yield text
        return
    for start in range(0, len(text), MAX_TOOL_TEXT_CHARS):
        yield text[start : start + MAX_TOOL_TEXT_CHARS]


def text_chunk(session_id: str, kind: ChunkKind, message_id: str, text: str) -> SessionNotification:
    """The typed notification of one text chunk."""
    variant = _CHUNK_TYPES[kind]
    return SessionNotification(
        session_id=session_id,
        update=variant(content=TextContent(text=text), message_id=message_id),
    )


def encode_update(notification: SessionNotification) -> bytes:
    """The typed path: one ``session/update`` line (newline included)."""
    return encode_notification(UPDATE_METHOD, unstructure(notification))


def text_template(session_id: str, kind: ChunkKind) -> TextTemplate | None:
    """The bytes around the encoded text and message id in a text chunk's line, cut from the
    typed path's own line; ``None`` if the session id makes the cut ambiguous (then the typed
    path is used)."""
    line = encode_update(text_chunk(session_id, kind, _ID_MARK, _TEXT_MARK))
    if line.count(_TEXT_MARK_JSON) != 1 or line.count(_ID_MARK_JSON) != 1:
        return None
    head, _, rest = line.partition(_TEXT_MARK_JSON)
    middle, found, tail = rest.partition(_ID_MARK_JSON)
    if not found:
        return None  # the id comes before the text: not the shape this template knows
    return head, middle, tail


#: A Markdown list item: a bullet or a number, then an optional task box.
_LIST_ITEM: Final = re.compile(r"\s*(?:[-*+]|\d{1,9}[.)])\s+(?:\[([ xX>])\]\s+)?(\S.*)")
_BOX_STATUS: Final = {
    "x": PlanStatus.COMPLETED,
    "X": PlanStatus.COMPLETED,
    ">": PlanStatus.IN_PROGRESS,
    " ": PlanStatus.PENDING,
}


def markdown_checklist(markdown: str) -> tuple[PlanEntry, ...]:
    """A Markdown plan as a checklist, for a client that shows only checklists: one entry per
    list item (``- [x]`` completed, ``- [>]`` in progress, else pending), at most the plan's
    entry bound; a plan without list items is one entry holding its first line that says
    something."""
    entries: list[PlanEntry] = []
    for line in markdown.splitlines():
        item = _LIST_ITEM.fullmatch(line)
        if item is None:
            continue
        box, text = item.groups()
        entries.append(PlanEntry(content=text.strip(), status=_BOX_STATUS[box or " "]))
        if len(entries) == MAX_PLAN_ENTRIES:
            break
    if entries:
        return tuple(entries)
    for line in markdown.splitlines():
        if line.strip():
            return (PlanEntry(content=line.strip()),)
    return (PlanEntry(content=markdown.strip()),)


def mode_state(settings: SessionSettings) -> SessionModeState:
    """The session's current mode and every mode the host offers."""
    return SessionModeState(
        current_mode_id=settings.mode.id,
        available_modes=tuple(
            SessionMode(id=mode.id, name=mode.name, description=mode.description or None)
            for mode in settings.modes
        ),
    )


def goal_snapshot(goal: GoalRecord) -> GoalSnapshot:
    """The goal extension's snapshot of a stored goal (Unix ms timestamps)."""
    budgets: dict[str, Any] = {}
    if goal.token_budget is not None:
        budgets["tokenBudget"] = goal.token_budget
    if goal.tokens_used is not None:
        budgets["tokensUsed"] = goal.tokens_used
    return GoalSnapshot(
        objective=goal.objective,
        status=goal.status.value,
        iterations=goal.iterations,
        last_reason=None if goal.last_reason is None else bound_text(goal.last_reason, 500),
        created_at=goal.created_ms,
        updated_at=goal.updated_ms,
        budgets=budgets or None,
        control_method=GOAL_CONTROL_METHOD,
    )


def _diff(diff: FileDiff) -> Diff:
    """A diff bounded like other tool content; a cut, here or before the edge, is visible."""
    new_text = truncate(diff.new_text, MAX_TOOL_TEXT_CHARS, CUT_DIFF)
    if diff.truncated and not new_text.endswith(CUT_DIFF):
        new_text = new_text[: MAX_TOOL_TEXT_CHARS - len(CUT_DIFF)] + CUT_DIFF
    old_text = (
        None if diff.old_text is None else truncate(diff.old_text, MAX_TOOL_TEXT_CHARS, CUT_DIFF)
    )
    return Diff(path=diff.path, new_text=new_text, old_text=old_text)


class SessionProjector:
    """Builds every ``session/update`` of one session."""

    def __init__(
        self,
        session_id: str,
        *,
        notices: bool = False,
        compaction: bool = False,
        plans: bool = False,
    ) -> None:
        self.session_id = session_id
        #: The client takes plan operations (``plan_update``, ``plan_removed``: v1's
        #: ``clientCapabilities.plan``, every v2 client); others get the legacy ``plan``.
        self.plans = plans
        #: Whether the client holds a plan now (a cleared plan is removed only then).
        self._plan_shown = False
        #: The client shows ``notice`` updates (``clientCapabilities.session.notices``).
        self.notices = notices
        #: The client follows compactions (``clientCapabilities.session.compaction``); others
        #: are sent no compaction update, live or replayed.
        self.compaction = compaction
        self._announced: set[str] = set()
        self._templates: dict[str, TextTemplate | None] = {}
        #: The message being streamed: (message id, kind, head bytes, bytes after the text).
        self._current: tuple[str, str, bytes, bytes] | None = None

    def _wrap(self, update: SessionUpdate) -> SessionNotification:
        return SessionNotification(session_id=self.session_id, update=update)

    def text(self, kind: ChunkKind, message_id: str, text: str) -> list[bytes]:
        """The finished lines of one text chunk (more than one only past the text bound)."""
        line = self.text_line(kind, message_id, text)
        if line is not None:
            return [line]
        template = self._templates[kind]
        if template is None:
            return [
                encode_update(text_chunk(self.session_id, kind, message_id, piece))
                for piece in _pieces(text)
            ]
        head, middle, tail = template
        after = middle + orjson.dumps(message_id) + tail
        return [head + orjson.dumps(piece) + after for piece in _pieces(text)]

    def text_line(self, kind: ChunkKind, message_id: str, text: str) -> bytes | None:
        """The streaming hot path: the one finished line of a chunk within the text bound, or
        ``None`` when :meth:`text` must do it (a longer text, or no usable template). The
        bytes after the text are kept for the message being streamed."""
        current = self._current
        if current is not None and current[0] == message_id and current[1] == kind:
            if len(text) <= MAX_TOOL_TEXT_CHARS:
                return current[2] + orjson.dumps(text) + current[3]
            return None
        template = self._template(kind)
        if template is None:
            return None
        head, middle, tail = template
        after = middle + orjson.dumps(message_id) + tail
        self._current = (message_id, kind, head, after)
        if len(text) <= MAX_TOOL_TEXT_CHARS:
            return head + orjson.dumps(text) + after
        return None

    def _template(self, kind: ChunkKind) -> TextTemplate | None:
        templates = self._templates
        if kind in templates:
            return templates[kind]
        template = templates[kind] = text_template(self.session_id, kind)
        return template

    def tool_call(self, tool_id: str, tool: ToolState, *, summary: str = "") -> ToolCallUpdate:
        """A tool call's fields as ACP shows them: the terminal output (else the request
        summary) as text, its diffs, its absolute locations, and raw input and output bounded
        (:func:`bound_raw`). Used untagged by a permission request; :meth:`tool` sends it."""
        text = tool.output_text if tool.output_text is not None else summary
        content: list[ToolCallContent] = []
        if text:
            content.append(Content(content=TextContent(text=bound_text(text))))
        content.extend(_diff(diff) for diff in tool.diffs)
        locations = tool_locations(tool.locations)
        return ToolCallUpdate(
            tool_call_id=tool_id,
            title=bound_text(tool.title or summary or tool.name, MAX_TITLE_CHARS),
            # The stable name on every row, live or replayed: clients key tool rendering on it.
            name=tool.name or None,
            kind=infer_tool_kind(tool.name),
            status=_STATUS[tool.status],
            content=tuple(content) or None,
            locations=locations or None,
            raw_input=bound_raw(tool.raw_input),
            raw_output=bound_raw(tool.raw_output),
        )

    def tool(self, tool_id: str, tool: ToolState, *, summary: str = "") -> SessionNotification:
        """``tool_call`` for the first row of ``tool_id``, ``tool_call_update`` after it."""
        call = self.tool_call(tool_id, tool, summary=summary)
        if tool_id in self._announced:
            return self._wrap(call)
        self._announced.add(tool_id)
        return self._wrap(
            ToolCall(
                tool_call_id=call.tool_call_id,
                title=call.title or "",
                name=call.name,
                kind=call.kind,
                status=call.status,
                content=call.content,
                locations=call.locations,
                raw_input=call.raw_input,
                raw_output=call.raw_output,
            )
        )

    def shell_output(self, output: ShellOutput) -> list[Outbound]:
        """A command's live output as v1 shows it: its tool call's text content replaced by
        the tail (the last ``LIVE_TAIL_CHARS`` characters exactly), still ``in_progress``;
        the call is announced first if this is its first row here. The snapshot at exit is
        the call's final row, which follows it with the same tail and the exit status."""
        tool_id = output.tool_id
        if output.exited:
            return []
        content = (Content(content=TextContent(text=output.tail)),) if output.tail else None
        if tool_id in self._announced:
            if content is None:
                return []
            return [
                self._wrap(
                    ToolCallUpdate(tool_call_id=tool_id, status="in_progress", content=content)
                )
            ]
        self._announced.add(tool_id)
        return [
            self._wrap(
                ToolCall(
                    tool_call_id=tool_id,
                    title=bound_text(f"shell: {output.command}", MAX_TITLE_CHARS),
                    name="shell",
                    kind=infer_tool_kind("shell"),
                    status="in_progress",
                    content=content,
                )
            )
        ]

    def notice(self, message_id: str, text: str, *, as_thought: bool = False) -> list[bytes]:
        """A notice about the run (overflow, failure) as visible agent text, or as a thought
        (a wait on the provider, for a client that does not show notices)."""
        kind: ChunkKind = "agent_thought_chunk" if as_thought else "agent_message_chunk"
        return self.text(kind, message_id, bound_text(text, 500))

    def session_notice(self, level: NoticeSeverity, text: str) -> SessionNotification:
        """A notice as a ``notice`` update (only for a client that shows them)."""
        return self._wrap(Notice(severity=level, title=bound_text(text, 500)))

    def title(self, title: str) -> SessionNotification:
        return self._wrap(SessionInfoUpdate(title=bound_text(title, MAX_TITLE_CHARS)))

    def goal(self, goal: GoalRecord | None) -> SessionNotification:
        return self._wrap(goal_info_update(None if goal is None else goal_snapshot(goal)))

    def config_update(self, options: tuple[SessionConfigOption, ...]) -> SessionNotification:
        return self._wrap(ConfigOptionUpdate(config_options=options))

    def current_mode(self, mode_id: str) -> SessionNotification:
        return self._wrap(CurrentModeUpdate(current_mode_id=mode_id))

    def plan_operation(
        self, entries: Sequence[PlanEntry], markdown: str = ""
    ) -> SessionNotification | None:
        """The update for the whole plan as it stands now (a checklist, Markdown, or neither:
        cleared). A client that takes plan operations gets ``plan_update``, or for a cleared
        plan ``plan_removed`` if it holds one (else nothing); others get :meth:`plan`, a
        Markdown plan as the checklist of its list items (:func:`markdown_checklist`)."""
        if not self.plans:
            if markdown and not entries:
                entries = markdown_checklist(markdown)
            return self.plan(entries)
        if not entries and not markdown:
            shown, self._plan_shown = self._plan_shown, False
            return self._wrap(PlanRemoved(plan_id=PLAN_ID)) if shown else None
        self._plan_shown = True
        content: PlanUpdateContent
        if entries:
            content = PlanItems(plan_id=PLAN_ID, entries=self._plan_entries(entries))
        else:
            content = PlanMarkdown(plan_id=PLAN_ID, content=markdown)
        return self._wrap(PlanUpdate(plan=content))

    def _plan_entries(self, entries: Sequence[PlanEntry]) -> tuple[wire.PlanEntry, ...]:
        return tuple(
            wire.PlanEntry(
                content=bound_text(entry.content, MAX_TITLE_CHARS),
                priority=entry.priority.value,
                status=entry.status.value,
            )
            for entry in entries
        )

    def plan(self, entries: Sequence[PlanEntry]) -> SessionNotification:
        """The whole plan as the legacy ``plan`` update (ACP replaces the client's plan with
        each one)."""
        return self._wrap(Plan(entries=self._plan_entries(entries)))

    def context_usage(
        self, used: int, size: int, cost_usd: float | None = None
    ) -> SessionNotification:
        """Context use, with the session's cumulative cost only when the backend knows it."""
        cost = None if cost_usd is None else wire.Cost(amount=cost_usd, currency="USD")
        return self._wrap(UsageUpdate(used=used, size=size, cost=cost))

    def commands(self, commands: Sequence[CommandInfo]) -> SessionNotification:
        return self._wrap(
            AvailableCommandsUpdate(
                available_commands=tuple(
                    AvailableCommand(
                        name=command.name,
                        description=bound_text(command.description, MAX_TITLE_CHARS),
                        input=None
                        if not command.input_hint
                        else UnstructuredCommandInput(hint=command.input_hint),
                    )
                    for command in commands
                )
            )
        )

    def compaction_update(
        self,
        compaction_id: str,
        status: CompactionStatus,
        *,
        summary: str | None = None,
        error: str | None = None,
    ) -> SessionNotification:
        """A compaction's state (with its whole summary, for a replay)."""
        return self._wrap(
            CompactionUpdate(
                compaction_id=compaction_id,
                status=status,
                summary=None if summary is None else (TextContent(text=summary),),
                error=None if error is None else bound_text(error, 500),
            )
        )

    def compaction_text(self, compaction_id: str, text: str) -> SessionNotification:
        return self._wrap(
            CompactionSummaryChunk(compaction_id=compaction_id, content=TextContent(text=text))
        )

    def image(self, message_id: str, image: ImageRef, data: bytes) -> SessionNotification:
        """A user message's image as a ``user_message_chunk`` (a replay)."""
        return self._wrap(
            UserMessageChunk(
                content=ImageContent(
                    data=base64.b64encode(data).decode("ascii"),
                    mime_type=image.mime_type,
                    uri=image.uri,
                ),
                message_id=message_id,
            )
        )

    def image_placeholder(self, message_id: str, image: ImageRef, why: str) -> list[bytes]:
        """What a replay shows instead of an image it cannot send (one line of user text)."""
        return self.text("user_message_chunk", message_id, f"[{describe_image(image)}: {why}]")

    def history(self, rows: Sequence[TimelineItem | MessageRow]) -> Iterator[Outbound | ImageSlot]:
        """Replay of stored history through the same rules as live events, as a client that
        has nothing yet must see it: every tool id is announced afresh (a re-attaching client
        rebuilds its view), and only the latest plan is sent (each plan replaces the last).
        A message row may come as a ``MessageRow`` or as a whole item; a user message's
        images follow its text as :class:`ImageSlot` values for the replay to fill."""
        self._announced.clear()
        latest_plan = max(
            (
                index
                for index, row in enumerate(rows)
                if not isinstance(row, MessageRow) and row.kind is ItemKind.PLAN
            ),
            default=-1,
        )
        # Message rows, nearly all of a history, are built straight from the template of their
        # kind (each row is a message of its own, so the streaming cache would not hit).
        wrappers = {kind: self._template(chunk_kind) for kind, chunk_kind in _CHUNK_KIND.items()}
        dumps = orjson.dumps
        for index, row in enumerate(rows):
            if isinstance(row, MessageRow):
                kind, item_id, text = row
                item = None
            else:
                item = row
                kind, item_id, text = item.kind, item.item_id, item.text
            wrapper = wrappers.get(kind)
            if wrapper is not None:
                if text and len(text) <= MAX_TOOL_TEXT_CHARS:
                    yield wrapper[0] + dumps(text) + wrapper[1] + dumps(item_id) + wrapper[2]
                elif text:
                    yield from self.text(_CHUNK_KIND[kind], item_id, text)
                if item is not None:
                    for image in item.images:
                        yield ImageSlot(item_id, image)
            elif item is None:
                raise ValueError(f"a message row of kind {kind!r}")
            elif kind is ItemKind.TOOL:
                if item.tool is not None:
                    yield self.tool(item_id, item.tool, summary=text)
            elif kind is ItemKind.PLAN and index == latest_plan:
                update = self.plan_operation(item.plan, item.text)
                if update is not None:
                    yield update
            elif kind is ItemKind.COMPACTION and self.compaction:
                yield self.compaction_update(item_id, "completed", summary=text)
