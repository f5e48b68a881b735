"""ACP v2 (draft 2.0.0-alpha.12) as a dialect: its method table, projection and answers.

What differs from v1, and where it is decided here:

- ``session/prompt`` is answered once the user message is inserted (its id); the turn is
  framed by ``state_update``: ``running`` when a run starts, ``requires_action`` while a
  permission question waits, ``idle`` with the stop reason after the run's last update;
- no ``session/load``: ``session/resume`` replays the history when ``replayFrom`` is
  ``{"type": "start"}`` (any other cursor is ``-32602``) and always sends the current state
  before its answer;
- updates are upserts keyed by id: every row of a tool is ``tool_call_update`` (the first one
  too), every chunk carries its ``messageId``, the plan is a ``plan_update`` with one id;
- a permission question carries ``title`` and ``subject``; config options are keyed by
  ``configId``; there are no session modes (the ``mode`` config option remains).

Text chunks keep v1's line (the v2 ``ContentChunk`` has the same keys), so the streaming hot
path is the same code. Every other update is finished into a line here. No I/O.

This module is the v2 dialect: its method table, its projection and its answers, the one
object a connection chooses at ``initialize`` for v2, so every v2 rule is found here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Literal

from maple_acp.edge._bounds import (
    MAX_TOOL_TEXT_CHARS,
    bound_raw,
    bound_text,
    infer_tool_kind,
    tool_locations,
)
from maple_acp.edge._dialect import (
    CHUNK_KINDS,
    PERMISSION_OPTIONS,
    ClientFeatures,
    ConfigOptions,
    InitializeParams,
    Outbound,
    PermissionQuestion,
    ResumeParams,
    Route,
    SessionSettings,
    stop_reason,
)
from maple_acp.edge._projection import (
    MAX_TITLE_CHARS,
    SessionProjector,
    encode_update,
)
from maple_acp.edge._v2_shapes import (
    CHUNK_KIND_OF,
    MESSAGE_KIND_OF,
    TOOL_STATUS,
    base64_text,
    diff_shape,
    state_line,
    terminal_block,
    update_line,
    v2_config_options,
)
from maple_acp.model import (
    CommandInfo,
    GoalRecord,
    ImageRef,
    ItemKind,
    MessageRow,
    PlanEntry,
    TimelineItem,
    ToolState,
    ToolStatus,
)
from maple_acp.runtime import (
    CommandsChanged,
    ContextUsage,
    PlanUpdated,
    RunEvent,
    RunNotice,
    RunState,
    ShellOutput,
    TitleChanged,
    ToolOutput,
    ToolRequest,
    ToolRow,
)
from maple_acp.runtime import StopReason as RunStopReason
from maple_acp.runtime import Usage as RunUsage
from maple_acp.wire import AGENT_METHODS as V1_METHODS
from maple_acp.wire import (
    BACKGROUND_METHOD,
    GOAL_CONTROL_METHOD,
    INVALID_PARAMS,
    QUEUE_METHOD,
    REQUEST_CANCELLED,
    STATUS_METHOD,
    STEERING_METHOD,
    CloseSessionRequest,
    DeleteSessionRequest,
    Implementation,
    InitializeResponse,
    ListSessionsRequest,
    PermissionOption,
    ProtocolError,
    SessionNotification,
    SteeringResponse,
    TextContent,
    unstructure,
    v2,
)

#: The protocol version this dialect speaks.
VERSION: Final = 2

#: The one replay cursor this agent serves: the whole retained history.
REPLAY_FROM_START: Final = "start"
#: The update that ends a replay (upstream schema 1.18; alpha.12 takes it as an open kind).
REPLAY_COMPLETE: Final = "replay_complete"

_PARAMS: Final[Mapping[str, tuple[type[object], str]]] = {
    "initialize": (v2.V2InitializeRequest, "initialize"),
    "session/new": (v2.V2NewSessionRequest, "new_session"),
    "session/resume": (v2.V2ResumeSessionRequest, "resume_session"),
    "session/list": (ListSessionsRequest, "list_sessions"),
    "session/prompt": (v2.V2PromptRequest, "prompt"),
    "session/close": (CloseSessionRequest, "close_session"),
    "session/delete": (DeleteSessionRequest, "delete_session"),
    "session/set_config_option": (v2.V2SetSessionConfigOptionRequest, "set_config_option"),
    GOAL_CONTROL_METHOD: (V1_METHODS[GOAL_CONTROL_METHOD].params, "goal_control"),
    STEERING_METHOD: (V1_METHODS[STEERING_METHOD].params, "steer"),
    BACKGROUND_METHOD: (V1_METHODS[BACKGROUND_METHOD].params, "background"),
    QUEUE_METHOD: (V1_METHODS[QUEUE_METHOD].params, "queue"),
    STATUS_METHOD: (V1_METHODS[STATUS_METHOD].params, "status"),
}
#: Each inbound method, its params type and the operation that serves it.
ROUTES: Final[Mapping[str, Route]] = MappingProxyType(
    {method: Route.of(params, operation) for method, (params, operation) in _PARAMS.items()}
)


def _info(answer: InitializeResponse) -> Implementation:
    # The service always names itself; the v1 type only allows leaving it out.
    assert answer.agent_info is not None
    return answer.agent_info


class V2Projection:
    """v2's updates of one session. Text goes through v1's projector (same line); the rest is
    built here. Keeps how many permission questions wait, for ``requires_action``."""

    def __init__(self, session_id: str, *, notices: bool = True, compaction: bool = False) -> None:
        self.session_id = session_id
        self._text = SessionProjector(session_id, plans=True)
        self.text_line = self._text.text_line
        self.text = self._text.text
        self.notice = self._text.notice
        self._waiting = 0
        #: Tool calls whose command's output is shown as a terminal (its id is theirs).
        self._terminals: set[str] = set()

    def _update(self, kind: str, body: object) -> bytes:
        return update_line(self.session_id, kind, body)

    def _shared(self, notification: SessionNotification) -> bytes:
        """An update whose v1 shape is also v2's (session info, goal, usage, notice)."""
        return encode_update(notification)

    # -- run events ------------------------------------------------------------------------

    def event(self, event: RunEvent) -> Outbound | list[bytes] | None:
        if isinstance(event, ToolRow):
            return self.tool(event.tool_id, event.tool)
        if isinstance(event, ToolOutput):
            return self._terminal_lines(event.output)
        if isinstance(event, TitleChanged):
            return self.title(event.title)
        if isinstance(event, PlanUpdated):
            return self.plan(event.entries, event.markdown)
        if isinstance(event, ContextUsage):
            return self._shared(self._text.context_usage(event.used, event.size, event.cost_usd))
        if isinstance(event, CommandsChanged):
            return self.commands(event.commands)
        if isinstance(event, RunNotice):
            # A terminal notice (failure, overflow) is the turn's visible answer: agent text.
            if not event.terminal:
                return self._shared(self._text.session_notice(event.level, event.text))
            return self.notice(f"{event.run_id}-notice", event.text)
        return None

    def shell_output(self, output: ShellOutput) -> list[Outbound]:
        return list(self._terminal_lines(output))

    def _terminal_lines(self, output: ShellOutput) -> list[bytes]:
        """A command's live output as alpha.12 shows it: the call's agent-owned terminal
        (its id is the tool call's), announced by a ``terminal_update`` (command, cwd) and
        the call's ``terminal`` content before any output; then each snapshot's new bytes as
        a ``terminal_output_chunk``, or, when more came than the tail holds, a replacement
        ``output``; the exit status in the last ``terminal_update``."""
        terminal = output.tool_id
        lines: list[bytes] = []
        if terminal not in self._terminals:
            self._terminals.add(terminal)
            opened = {"terminalId": terminal, "command": output.command, "cwd": output.cwd}
            lines.append(self._update("terminal_update", opened))
            shown = {
                "toolCallId": terminal,
                "status": "in_progress",
                "content": [terminal_block(terminal)],
            }
            lines.append(self._update("tool_call_update", shown))
        if output.appended is None:
            replaced = {"terminalId": terminal, "output": {"data": base64_text(output.tail)}}
            lines.append(self._update("terminal_update", replaced))
        elif output.appended:
            chunk = {"terminalId": terminal, "data": base64_text(output.appended)}
            lines.append(self._update("terminal_output_chunk", chunk))
        if output.exited:
            status: dict[str, Any] = {"exitCode": output.exit_code}
            if output.signal is not None:
                status["signal"] = output.signal
            lines.append(
                self._update("terminal_update", {"terminalId": terminal, "exitStatus": status})
            )
        return lines

    def tool_call(self, tool_id: str, tool: ToolState, *, summary: str = "") -> v2.V2ToolCallUpdate:
        text = tool.output_text if tool.output_text is not None else summary
        content: list[dict[str, Any]] = []
        if tool_id in self._terminals:
            # The terminal holds the output and the exit status; a failure keeps its text's first
            # line (its status) for a client that shows text and not terminals.
            content.append(terminal_block(tool_id))
            text = text.partition("\n")[0] if tool.status is ToolStatus.FAILED else ""
        if text:
            content.append(
                {"type": "content", "content": {"type": "text", "text": bound_text(text)}}
            )
        content.extend(diff_shape(diff) for diff in tool.diffs)
        locations = tuple(unstructure(location) for location in tool_locations(tool.locations))
        return v2.V2ToolCallUpdate(
            tool_call_id=tool_id,
            title=bound_text(tool.title or summary or tool.name, MAX_TITLE_CHARS),
            name=tool.name or None,
            kind=infer_tool_kind(tool.name),
            status=TOOL_STATUS[tool.status],
            content=tuple(content) or None,
            locations=locations or None,
            raw_input=bound_raw(tool.raw_input),
            raw_output=bound_raw(tool.raw_output),
        )

    def tool(self, tool_id: str, tool: ToolState, *, summary: str = "") -> bytes:
        """Every row of a tool, the first one too: an upsert keyed by the tool call id."""
        return self._update("tool_call_update", self.tool_call(tool_id, tool, summary=summary))

    def title(self, title: str) -> bytes:
        return self._shared(self._text.title(title))

    def goal(self, goal: GoalRecord | None) -> bytes:
        return self._shared(self._text.goal(goal))

    def plan(self, entries: Sequence[PlanEntry], markdown: str = "") -> bytes | None:
        """``plan_update`` (items or Markdown) with the session's one plan id, or
        ``plan_removed`` once a plan the client holds is cleared: v1's plan operations have
        v2's shape."""
        update = self._text.plan_operation(entries, markdown)
        return None if update is None else self._shared(update)

    def commands(self, commands: Sequence[CommandInfo]) -> bytes:
        return self._update(
            "available_commands_update",
            v2.V2AvailableCommandsUpdate(
                available_commands=tuple(
                    v2.V2Command(
                        name=command.name,
                        description=bound_text(command.description, MAX_TITLE_CHARS),
                        input=None
                        if not command.input_hint
                        else v2.V2TextCommandInput(hint=command.input_hint),
                    )
                    for command in commands
                )
            ),
        )

    def config_update(self, options: ConfigOptions) -> bytes:
        return self._update(
            "config_option_update",
            v2.V2ConfigOptionUpdate(config_options=v2_config_options(options)),
        )

    def mode_change(self, mode_id: str, options: ConfigOptions) -> list[Outbound]:
        # v2 has no session modes: the mode is the ``mode`` config option.
        return [self.config_update(options)]

    def image(self, message_id: str, image: ImageRef, data: bytes) -> Outbound:
        # A v2 replay shows a message's text only (``history`` yields no image slot); were
        # one asked for, it is named in a line of text.
        return self.image_placeholder(message_id, image, "not replayed")[0]

    def image_placeholder(self, message_id: str, image: ImageRef, why: str) -> list[bytes]:
        return self._text.image_placeholder(message_id, image, why)

    def message(self, kind: str, message_id: str, text: str) -> list[bytes]:
        """A stored message as a client that may hold it already must get it: one
        whole-message upsert whose content replaces what it has; past the text bound, a primer
        that empties the message (``content: []``) and then its text in chunks."""
        whole = MESSAGE_KIND_OF[kind]
        if len(text) <= MAX_TOOL_TEXT_CHARS:
            content = (TextContent(text=text),)
            return [self._update(whole, v2.V2MessageUpsert(message_id=message_id, content=content))]
        primer = self._update(whole, v2.V2MessageUpsert(message_id=message_id, content=()))
        return [primer, *self.text(CHUNK_KIND_OF[kind], message_id, text)]

    def history(self, rows: Sequence[TimelineItem | MessageRow]) -> Iterator[Outbound]:
        """Stored history as upserts: each message by its id, whole (its text; images and
        compactions are not replayed on v2 yet), so a replay never adds to a message the
        client holds; each tool by its latest row; the latest plan."""
        latest_plan = max(
            (
                index
                for index, row in enumerate(rows)
                if not isinstance(row, MessageRow) and row.kind is ItemKind.PLAN
            ),
            default=-1,
        )
        for index, row in enumerate(rows):
            if isinstance(row, MessageRow):
                kind, item_id, text = row
                item = None
            else:
                item = row
                kind, item_id, text = item.kind, item.item_id, item.text
            if kind in MESSAGE_KIND_OF:
                if text:
                    yield from self.message(kind, item_id, text)
            elif item is None:
                raise ValueError(f"a message row of kind {kind!r}")
            elif kind is ItemKind.TOOL:
                if item.tool is not None:
                    yield self.tool(item_id, item.tool, summary=text)
            elif kind is ItemKind.PLAN and index == latest_plan:
                plan = self.plan(item.plan, item.text)
                if plan is not None:
                    yield plan

    # -- permission questions ----------------------------------------------------------------

    def _ask(
        self, title: str, call: v2.V2ToolCallUpdate, options: Sequence[PermissionOption]
    ) -> v2.V2RequestPermissionRequest:
        return v2.V2RequestPermissionRequest(
            session_id=self.session_id,
            title=title,
            subject=v2.V2ToolCallSubject(tool_call=call),
            options=tuple(options),
        )

    def permission_request(self, request: ToolRequest) -> PermissionQuestion:
        pending = ToolState(
            name=request.name,
            status=ToolStatus.PENDING,
            title=request.title,
            raw_input=request.raw_input,
        )
        call = self.tool_call(request.tool_id, pending)
        return self._ask(call.title or request.name, call, PERMISSION_OPTIONS)

    def question(
        self, question_id: str, title: str, options: Sequence[PermissionOption]
    ) -> PermissionQuestion:
        call = v2.V2ToolCallUpdate(
            tool_call_id=question_id, title=title, kind="other", status="pending"
        )
        return self._ask(title, call, options)

    # -- the turn's frame --------------------------------------------------------------------

    def accepted(self, message_id: str, text: str) -> list[Outbound]:
        # The live session echoes the inserted user message under its id.
        return list(self.text("user_message_chunk", message_id, text))

    def run_started(self) -> list[Outbound]:
        self._waiting = 0
        return [state_line(self.session_id, "running")]

    def turn_ended(
        self, state: RunState, usage: RunUsage | None, reason: RunStopReason
    ) -> list[Outbound]:
        return []  # the run's ``state_update`` idle already ended it

    def run_ended(self, state: RunState, reason: RunStopReason) -> list[Outbound]:
        self._waiting = 0
        return [state_line(self.session_id, "idle", stop_reason(state, reason))]

    def permission_waiting(self) -> list[Outbound]:
        self._waiting += 1
        return [state_line(self.session_id, "requires_action")] if self._waiting == 1 else []

    def permission_settled(self) -> list[Outbound]:
        if self._waiting == 0:
            return []
        self._waiting -= 1
        return [state_line(self.session_id, "running")] if self._waiting == 0 else []

    def attached(self, running: bool) -> list[Outbound]:
        if running:
            return [state_line(self.session_id, "requires_action" if self._waiting else "running")]
        return [state_line(self.session_id, "idle")]

    def replay_complete(self) -> list[Outbound]:
        # Once per resume that named ``replayFrom``, even for an empty replay: a client takes
        # a replay that ends without it (and without an answer) as cut short. Each child
        # session the replay announces gets its own, after its transcript (edge/_children.py).
        return [self._update(REPLAY_COMPLETE, {})]


class V2Dialect:
    """ACP version 2, draft 2.0.0-alpha.12 (see the module docstring)."""

    version: Final = VERSION
    routes: Final = ROUTES
    chunk_kinds: Final = CHUNK_KINDS
    answers_on_acceptance: Final = True
    accepts_batches: Final = True

    def projection(
        self,
        session_id: str,
        *,
        notices: bool = True,
        compaction: bool = False,
        plans: bool = True,
    ) -> V2Projection:
        # Plan operations are v2's own plan updates: every v2 client takes them.
        return V2Projection(session_id, notices=notices, compaction=compaction)

    def client_features(self, request: InitializeParams) -> ClientFeatures:
        # v2's elicitation is another shape; the trust question asks with the chooser. A
        # notice is a baseline v2 update, shown by every client that knows it. Compactions
        # are not projected to v2 yet. Plan operations, child sessions and boolean options are
        # v2's baseline (no capability for any: a client ignores a kind of option it does not
        # know).
        return ClientFeatures(notices=True, plans=True, boolean_options=True, subagents=True)

    def initialize_answer(self, answer: InitializeResponse) -> v2.V2InitializeResponse:
        v1_session = answer.agent_capabilities.session_capabilities
        delete: dict[str, Any] | None = (
            None if v1_session is None or v1_session.delete is None else {}
        )
        accepts = answer.agent_capabilities.prompt_capabilities
        prompt: dict[str, Any] = {
            key: {}
            for key, on in (("image", accepts.image), ("embeddedContext", accepts.embedded_context))
            if on
        }
        return v2.V2InitializeResponse(
            protocol_version=VERSION,
            info=_info(answer),
            capabilities=v2.V2AgentCapabilities(
                session=v2.V2SessionCapabilities(
                    prompt=prompt or None,
                    mcp=v2.V2McpCapabilities(http={}, acp={}),
                    delete=delete,
                    additional_directories={},
                ),
                # The extensions' own capabilities (the prompt queue) are v1's, carried over.
                meta=answer.agent_capabilities.meta,
            ),
            # The goal and steering extensions are advertised as on v1; a steer-started turn
            # is framed by its state_update running / idle like a prompt's.
            meta=answer.meta,
        )

    def replay_requested(self, request: ResumeParams) -> bool:
        if not isinstance(request, v2.V2ResumeSessionRequest):
            return False  # not v2's table: never structured for a v2 connection
        cursor = request.replay_from
        if cursor is None:
            return False
        if isinstance(cursor, dict) and cursor.get("type") == REPLAY_FROM_START:
            return True
        raise ProtocolError(INVALID_PARAMS, 'replayFrom: only {"type": "start"} is supported')

    def new_answer(
        self,
        session_id: str,
        options: ConfigOptions,
        settings: SessionSettings,
    ) -> v2.V2NewSessionResponse:
        return v2.V2NewSessionResponse(
            session_id=session_id, config_options=v2_config_options(options)
        )

    def resume_answer(
        self, options: ConfigOptions, settings: SessionSettings
    ) -> v2.V2ResumeSessionResponse:
        return v2.V2ResumeSessionResponse(config_options=v2_config_options(options))

    # Not in v2's table (no session/load, no session/fork): a resume's answer if ever asked.
    load_answer = resume_answer

    def fork_answer(
        self,
        session_id: str,
        options: ConfigOptions,
        settings: SessionSettings,
    ) -> v2.V2NewSessionResponse:
        return self.new_answer(session_id, options, settings)

    def steering_answer(
        self, outcome: Literal["injected", "startedNewTurn", "promptRequired"], reason: str | None
    ) -> SteeringResponse:
        return SteeringResponse(outcome=outcome, reason=reason)

    def acceptance_answer(self, message_id: str) -> v2.V2PromptResponse:
        return v2.V2PromptResponse(message_id=message_id)

    def prompt_answer(
        self,
        state: RunState,
        usage: RunUsage | None = None,
        reason: RunStopReason = RunStopReason.END_TURN,
    ) -> object:
        """Only a prompt that ended before its message was inserted is answered this way:
        it was not accepted, so it is an error (a cancel or close stopped it)."""
        raise ProtocolError(REQUEST_CANCELLED, "the prompt was cancelled before it was accepted")

    def mode_answer(self) -> dict[str, Any]:
        return {}  # no session/set_mode in v2

    def config_answer(self, options: ConfigOptions) -> v2.V2SetSessionConfigOptionResponse:
        return v2.V2SetSessionConfigOptionResponse(config_options=v2_config_options(options))


#: The ACP v2 draft: the dialect of a client that asks for 2 or newer, where the host allows it.
V2: Final = V2Dialect()
