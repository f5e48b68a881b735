"""ACP v1 as a dialect: the method table, the projection and the answer shapes of version 1.

The projection is :mod:`maple_acp.edge._projection`'s :class:`SessionProjector` plus the
mapping of run events to its updates; the answers are the v1 wire types. See
:mod:`maple_acp.edge._dialect` for what a dialect is. No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final, Literal

import attrs

from maple_acp.edge._dialect import (
    CHUNK_KINDS,
    PERMISSION_OPTIONS,
    ClientFeatures,
    ConfigOptions,
    InitializeParams,
    NoTurnFrames,
    Outbound,
    PermissionQuestion,
    ResumeParams,
    Route,
    SessionSettings,
    stop_reason,
)
from maple_acp.edge._projection import SessionProjector, encode_update, mode_state
from maple_acp.runtime import (
    CommandsChanged,
    CompactionChanged,
    CompactionText,
    ContextUsage,
    PlanUpdated,
    RunEvent,
    RunNotice,
    RunState,
    TitleChanged,
    ToolOutput,
    ToolRequest,
    ToolRow,
    ToolState,
    ToolStatus,
)
from maple_acp.runtime import StopReason as RunStopReason
from maple_acp.runtime import Usage as RunUsage
from maple_acp.wire import (
    AGENT_METHODS,
    BACKGROUND_METHOD,
    GOAL_CONTROL_METHOD,
    QUEUE_METHOD,
    STATUS_METHOD,
    STEERING_METHOD,
    TRANSCRIPT_METHOD,
    ForkSessionResponse,
    InitializeRequest,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    RequestPermissionRequest,
    ResumeSessionResponse,
    SetSessionConfigOptionResponse,
    SetSessionModeResponse,
    SteeringResponse,
    ToolCallUpdate,
    Usage,
    steering_turn_ended,
    unstructure,
)

#: The protocol version this dialect speaks.
VERSION: Final = 1

#: Each inbound method and the operation that serves it.
_OPERATIONS: Final = {
    "initialize": "initialize",
    "session/new": "new_session",
    "session/load": "load_session",
    "session/fork": "fork_session",
    "session/resume": "resume_session",
    "session/list": "list_sessions",
    "session/prompt": "prompt",
    "session/close": "close_session",
    "session/delete": "delete_session",
    "session/set_config_option": "set_config_option",
    "session/set_mode": "set_mode",
    GOAL_CONTROL_METHOD: "goal_control",
    STEERING_METHOD: "steer",
    BACKGROUND_METHOD: "background",
    QUEUE_METHOD: "queue",
    STATUS_METHOD: "status",
    TRANSCRIPT_METHOD: "transcript",
}


ROUTES: Final[Mapping[str, Route]] = MappingProxyType(
    {
        method: Route.of(AGENT_METHODS[method].params, operation)
        for method, operation in _OPERATIONS.items()
    }
)


class V1Projection(NoTurnFrames, SessionProjector):
    """v1's updates of one session: the projector, plus which update each run event is (the
    prompt's answer frames the turn: no frame updates)."""

    def mode_change(self, mode_id: str, options: ConfigOptions) -> list[Outbound]:
        # The mode option's currentValue changes with it: a client that shows config options
        # rather than modes stays right.
        return [self.current_mode(mode_id), self.config_update(options)]

    def question(
        self, question_id: str, title: str, options: Sequence[PermissionOption]
    ) -> PermissionQuestion:
        return RequestPermissionRequest(
            session_id=self.session_id,
            tool_call=ToolCallUpdate(
                tool_call_id=question_id, title=title, kind="other", status="pending"
            ),
            options=tuple(options),
        )

    def event(self, event: RunEvent) -> Outbound | list[bytes] | None:
        if isinstance(event, ToolRow):
            return self.tool(event.tool_id, event.tool)
        if isinstance(event, ToolOutput):
            updates = self.shell_output(event.output)
            return [u if isinstance(u, bytes) else encode_update(u) for u in updates]
        if isinstance(event, TitleChanged):
            return self.title(event.title)
        if isinstance(event, PlanUpdated):
            return self.plan_operation(event.entries, event.markdown)
        if isinstance(event, ContextUsage):
            return self.context_usage(event.used, event.size, event.cost_usd)
        if isinstance(event, CommandsChanged):
            return self.commands(event.commands)
        if isinstance(event, CompactionChanged):
            if not self.compaction:
                return None
            return self.compaction_update(event.compaction_id, event.status, error=event.error)
        if isinstance(event, CompactionText):
            return (
                self.compaction_text(event.compaction_id, event.text) if self.compaction else None
            )
        if isinstance(event, RunNotice):
            # A terminal notice (failure, overflow) is the turn's visible answer: text for all.
            if self.notices and not event.terminal:
                return self.session_notice(event.level, event.text)
            as_thought = event.fallback == "thought" and not event.terminal
            return self.notice(f"{event.run_id}-notice", event.text, as_thought=as_thought)
        return None

    def permission_request(self, request: ToolRequest) -> PermissionQuestion:
        pending = ToolState(
            name=request.name,
            status=ToolStatus.PENDING,
            title=request.title,
            raw_input=request.raw_input,
        )
        return RequestPermissionRequest(
            session_id=self.session_id,
            tool_call=self.tool_call(request.tool_id, pending),
            options=PERMISSION_OPTIONS,
        )

    def turn_ended(
        self, state: RunState, usage: RunUsage | None, reason: RunStopReason
    ) -> list[Outbound]:
        """``session_info_update`` with ``_meta.steering.turnEnded``: the stop reason and
        usage the turn's prompt answer would have carried."""
        answer = V1.prompt_answer(state, usage, reason)
        carried = unstructure(answer.usage) if answer.usage is not None else None
        return [self._wrap(steering_turn_ended(answer.stop_reason, carried))]


class V1Dialect:
    """ACP version 1 (see the module docstring)."""

    version: Final = VERSION
    routes: Final = ROUTES
    chunk_kinds: Final = CHUNK_KINDS
    answers_on_acceptance: Final = False
    accepts_batches: Final = False

    def client_features(self, request: InitializeParams) -> ClientFeatures:
        if not isinstance(request, InitializeRequest):
            return ClientFeatures()  # not v1's table: never structured for a v1 connection
        elicitation = request.client_capabilities.elicitation
        session = request.client_capabilities.session
        return ClientFeatures(
            elicitation_form=elicitation is not None and elicitation.form is not None,
            notices=session is not None and session.notices is not None,
            compaction=session is not None and session.compaction is not None,
            plans=request.client_capabilities.plan is not None,
            boolean_options=session is not None
            and session.config_options is not None
            and session.config_options.boolean is not None,
            subagents=request.client_capabilities.subagents is not None,
        )

    def initialize_answer(self, answer: InitializeResponse) -> InitializeResponse:
        if answer.protocol_version == VERSION:
            return answer
        return attrs.evolve(answer, protocol_version=VERSION)

    def replay_requested(self, request: ResumeParams) -> bool:
        return False  # v1 replays with session/load; its resume never does

    def acceptance_answer(self, message_id: str) -> None:
        return None  # never asked: a v1 prompt is answered when its turn ends

    def projection(
        self,
        session_id: str,
        *,
        notices: bool = False,
        compaction: bool = False,
        plans: bool = False,
    ) -> V1Projection:
        return V1Projection(session_id, notices=notices, compaction=compaction, plans=plans)

    def new_answer(
        self,
        session_id: str,
        options: ConfigOptions,
        settings: SessionSettings,
    ) -> NewSessionResponse:
        return NewSessionResponse(
            session_id=session_id, modes=mode_state(settings), config_options=options
        )

    def load_answer(self, options: ConfigOptions, settings: SessionSettings) -> LoadSessionResponse:
        return LoadSessionResponse(modes=mode_state(settings), config_options=options)

    def fork_answer(
        self,
        session_id: str,
        options: ConfigOptions,
        settings: SessionSettings,
    ) -> ForkSessionResponse:
        return ForkSessionResponse(
            session_id=session_id, modes=mode_state(settings), config_options=options
        )

    def resume_answer(
        self, options: ConfigOptions, settings: SessionSettings
    ) -> ResumeSessionResponse:
        return ResumeSessionResponse(modes=mode_state(settings), config_options=options)

    def prompt_answer(
        self,
        state: RunState,
        usage: RunUsage | None = None,
        reason: RunStopReason = RunStopReason.END_TURN,
    ) -> PromptResponse:
        """A completed turn answers the backend's reason; a failed one ``end_turn``: its
        failure text was already shown as agent text, and answering normally keeps a client
        from retrying work that may have had effects. Without usage (the backend reported
        none, or the turn was cancelled before its run began) the answer carries none: zeros
        would read as counts."""
        stop = stop_reason(state, reason)
        if usage is None:
            return PromptResponse(stop_reason=stop)
        return PromptResponse(
            stop_reason=stop,
            usage=Usage(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                total_tokens=usage.total_tokens,
                cached_read_tokens=usage.cache_read_tokens,
                cached_write_tokens=usage.cache_write_tokens,
            ),
        )

    def steering_answer(
        self, outcome: Literal["injected", "startedNewTurn", "promptRequired"], reason: str | None
    ) -> SteeringResponse:
        return SteeringResponse(outcome=outcome, reason=reason)

    def mode_answer(self) -> SetSessionModeResponse:
        return SetSessionModeResponse()

    def config_answer(self, options: ConfigOptions) -> SetSessionConfigOptionResponse:
        return SetSessionConfigOptionResponse(config_options=options)


#: ACP version 1: the dialect of a client that asks for 1, and of one whose request is malformed.
V1: Final = V1Dialect()
