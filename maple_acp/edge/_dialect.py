"""What differs between protocol versions, as one object per version chosen at ``initialize``.

A :class:`Dialect` holds the method table (method -> params type and the version-neutral
operation that serves it), the projection of runtime events and stored history into updates
(one :class:`Projection` per session) and the answer shapes (session open answers, the prompt
answer, modes and config options, the permission question). The flows (``_opening``,
``_closing``, ``_turn``, ``_trust``, ``_goals``) call these and never build a
version-specific shape themselves, so a second version is a second dialect, not version checks
in the flows. ``_v1`` and ``_v2`` are the two there are; they stand side by side and import
neither each other.

What every version shares is here, in the seam, not in one of them: the outbound types, the
config option ids and the options as the host offers them (a version reshapes them in its
answers), a well-formed config change, the permission options and the mapping of a client's
answer to the runtime's :class:`~maple_acp.runtime.PermissionAnswer`, the stop reason of a
finished run, the chunk kind of each text event and what the client declared at
``initialize`` (:class:`ClientFeatures`).

Nothing here does I/O: resource handling, errors and cancellation are the flows'. A dialect
refuses bad input with ``ProtocolError(-32602)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Final, Literal, Protocol

import attrs

from maple_acp.model import (
    CommandInfo,
    GoalRecord,
    ImageRef,
    MessageRow,
    TimelineItem,
)
from maple_acp.model import SessionMode as ModelSessionMode
from maple_acp.runtime import (
    BooleanOption,
    ModelChoices,
    PermissionAnswer,
    RunEvent,
    RunState,
    ShellOutput,
    StopReason,
    TextChunk,
    ThoughtChunk,
    ToolRequest,
    ToolState,
    Usage,
)
from maple_acp.wire import (
    INVALID_PARAMS,
    ChunkKind,
    InitializeRequest,
    InitializeResponse,
    PermissionOption,
    ProtocolError,
    RequestPermissionRequest,
    RequestPermissionResponse,
    ResumeSessionRequest,
    SelectedPermissionOutcome,
    SessionConfigBoolean,
    SessionConfigOption,
    SessionConfigSelect,
    SessionConfigSelectOption,
    SessionNotification,
    v2,
)
from maple_acp.wire import StopReason as WireStopReason

__all__ = [
    "CHUNK_KINDS",
    "DEFAULT_THOUGHT_LEVEL",
    "MODEL_OPTION_ID",
    "MODE_OPTION_ID",
    "PERMISSION_OPTIONS",
    "THOUGHT_LEVEL_OPTION_ID",
    "BooleanChange",
    "ClientFeatures",
    "ConfigChange",
    "ConfigOptions",
    "Dialect",
    "ImageSlot",
    "InitializeParams",
    "NoTurnFrames",
    "Outbound",
    "PermissionQuestion",
    "Projection",
    "ResumeParams",
    "Route",
    "SessionSettings",
    "config_change",
    "config_options",
    "permission_answer",
    "stop_reason",
]

MODEL_OPTION_ID: Final = "model"
MODE_OPTION_ID: Final = "mode"
THOUGHT_LEVEL_OPTION_ID: Final = "thought_level"
#: The ``thought_level`` value that leaves the effort to the backend (the runtime's ``None``).
DEFAULT_THOUGHT_LEVEL: Final = "default"

#: What a projection yields: a typed notification, or a text chunk's finished line.
Outbound = SessionNotification | bytes


@attrs.frozen
class ImageSlot:
    """Where a history replay shows an image of a user message: the replay reads its bytes
    (the projection does no I/O) and sends :meth:`SessionProjector.image`, or
    :meth:`SessionProjector.image_placeholder` when they are gone or too large to send."""

    message_id: str
    image: ImageRef


@attrs.frozen(kw_only=True)
class SessionSettings:
    """A session's mode, thinking-effort and boolean-option settings as its lease has them
    now."""

    modes: tuple[ModelSessionMode, ...]
    mode: ModelSessionMode
    thought_levels: tuple[str, ...] = ()
    thought_level: str | None = None
    #: The backend's boolean options, each with the session's value, in the backend's order.
    boolean_options: tuple[tuple[BooleanOption, bool], ...] = ()


#: The session's config options as the host offers them; a version reshapes them in its
#: answers and updates.
ConfigOptions = tuple[SessionConfigOption, ...]
#: An ``initialize`` request, as either version's method table structures it.
InitializeParams = InitializeRequest | v2.V2InitializeRequest
#: A ``session/resume`` request, as either version's method table structures it.
ResumeParams = ResumeSessionRequest | v2.V2ResumeSessionRequest
#: A permission question, in the shape of the session's version.
PermissionQuestion = RequestPermissionRequest | v2.V2RequestPermissionRequest

#: Permission options: only these two exist (there is no "always").
PERMISSION_OPTIONS: Final = (
    PermissionOption(option_id="allow_once", name="Allow once", kind="allow_once"),
    PermissionOption(option_id="reject_once", name="Reject", kind="reject_once"),
)
#: Our option ids, as the runtime's answers.
_ANSWERS: Final[Mapping[str, PermissionAnswer]] = MappingProxyType(
    {"allow_once": PermissionAnswer.ALLOW_ONCE, "reject_once": PermissionAnswer.DENY_ONCE}
)
#: The update kind of each text event.
CHUNK_KINDS: Final[Mapping[type, ChunkKind]] = MappingProxyType(
    {TextChunk: "agent_message_chunk", ThoughtChunk: "agent_thought_chunk"}
)
#: ACP's stop reason for a completed turn, by the backend's own (``TurnResult.stop_reason``).
_COMPLETED_REASONS: Final[Mapping[StopReason, WireStopReason]] = MappingProxyType(
    {
        StopReason.END_TURN: "end_turn",
        StopReason.MAX_TOKENS: "max_tokens",
        StopReason.MAX_TURN_REQUESTS: "max_turn_requests",
        StopReason.REFUSAL: "refusal",
    }
)
#: The session setting each config option changes.
_SETTINGS: Final[Mapping[str, Literal["model", "mode", "thought_level"]]] = MappingProxyType(
    {
        MODEL_OPTION_ID: "model",
        MODE_OPTION_ID: "mode",
        THOUGHT_LEVEL_OPTION_ID: "thought_level",
    }
)


@attrs.frozen
class Route:
    """One inbound method: its params type, the operation that serves it (a name the
    connection resolves to a flow's handler), and whether the params carry a session id."""

    params: type[object]
    operation: str
    has_session_id: bool = False

    @classmethod
    def of(cls, params: type[object], operation: str) -> Route:
        """The route of ``operation`` for params of type ``params`` (an attrs class)."""
        fields = attrs.fields(params) if attrs.has(params) else ()
        return cls(params, operation, any(field.name == "session_id" for field in fields))


@attrs.frozen
class ConfigChange:
    """A well-formed config change a client asked for: which of the session's settings, and
    its new value (``None``: the backend's default thinking effort). The runtime judges the
    value."""

    setting: Literal["model", "mode", "thought_level"]
    value: str | None


@attrs.frozen
class BooleanChange:
    """A well-formed change of one of the backend's boolean options."""

    option_id: str
    value: bool


@attrs.frozen
class ClientFeatures:
    """What a client declared it takes at ``initialize`` (all off until it does)."""

    #: Form elicitation (the trust question asks with it).
    elicitation_form: bool = False
    #: ``notice`` updates (else a notice is shown as text).
    notices: bool = False
    #: Compaction updates (else it is sent none).
    compaction: bool = False
    #: Plan operations, ``plan_update`` and ``plan_removed`` (else the legacy ``plan``).
    plans: bool = False
    #: Boolean config options (else the session offers its selects only).
    boolean_options: bool = False
    #: Child sessions (``subagent_update``, ``session_message``; else a child is a tool call).
    subagents: bool = False


def config_options(
    choices: ModelChoices,
    current_model: str,
    *,
    locked: bool,
    settings: SessionSettings,
    booleans: bool = False,
) -> tuple[SessionConfigOption, ...]:
    """The session's config options: ``model`` (all choices, or only the locked model once
    the task has history), ``mode`` (the host's modes), when the backend declares levels
    for the model, ``thought_level`` (the levels and ``default``) and, for a client that takes
    them (``booleans``), the backend's boolean options."""
    if locked:
        models = [m for m in choices.models if m.id == current_model]
        if not models:
            models_out = [SessionConfigSelectOption(value=current_model, name=current_model)]
        else:
            models_out = [SessionConfigSelectOption(value=m.id, name=m.name) for m in models]
    else:
        models_out = [
            SessionConfigSelectOption(value=m.id, name=m.name, description=m.description or None)
            for m in choices.models
        ]
    return (
        SessionConfigSelect(
            id=MODEL_OPTION_ID,
            name="Model",
            category="model",
            current_value=current_model,
            options=tuple(models_out),
            description="Locked once the session has history." if locked else None,
        ),
        SessionConfigSelect(
            id=MODE_OPTION_ID,
            name="Mode",
            category="mode",
            current_value=settings.mode.id,
            options=tuple(
                SessionConfigSelectOption(
                    value=mode.id, name=mode.name, description=mode.description or None
                )
                for mode in settings.modes
            ),
        ),
        *_thought_level_option(settings),
        *(_boolean_options(settings) if booleans else ()),
    )


def _boolean_options(settings: SessionSettings) -> tuple[SessionConfigOption, ...]:
    return tuple(
        SessionConfigBoolean(
            id=option.id,
            name=option.name,
            current_value=value,
            description=option.description or None,
        )
        for option, value in settings.boolean_options
        # An id the host's own options use stays theirs.
        if option.id not in _SETTINGS
    )


def _thought_level_option(settings: SessionSettings) -> tuple[SessionConfigOption, ...]:
    if not settings.thought_levels:
        return ()
    return (
        SessionConfigSelect(
            id=THOUGHT_LEVEL_OPTION_ID,
            name="Thinking effort",
            category="thought_level",
            current_value=settings.thought_level or DEFAULT_THOUGHT_LEVEL,
            options=(
                SessionConfigSelectOption(
                    value=DEFAULT_THOUGHT_LEVEL,
                    name="Default",
                    description="The model's own default effort",
                ),
                *(
                    SessionConfigSelectOption(value=level, name=level.capitalize())
                    for level in settings.thought_levels
                ),
            ),
        ),
    )


def config_change(
    config_id: str, value: object, boolean_ids: frozenset[str] = frozenset()
) -> ConfigChange | BooleanChange:
    """The setting a config change asks for, or ``-32602`` for an unknown option or a value
    of the wrong kind (a boolean for a select, anything but a boolean for one of the
    backend's ``boolean_ids``), naming the option."""
    setting = _SETTINGS.get(config_id)
    if setting is None and config_id in boolean_ids:
        if not isinstance(value, bool):
            raise ProtocolError(
                INVALID_PARAMS,
                f'value: {config_id} is a boolean option; send true or false with type "boolean"',
            )
        return BooleanChange(config_id, value)
    if setting is None:
        raise ProtocolError(INVALID_PARAMS, "configId: unknown config option")
    if not isinstance(value, str):
        raise ProtocolError(INVALID_PARAMS, f"value: expected a {config_id} value id")
    if setting == "thought_level" and value == DEFAULT_THOUGHT_LEVEL:
        return ConfigChange(setting, None)
    return ConfigChange(setting, value)


def permission_answer(response: RequestPermissionResponse) -> PermissionAnswer | None:
    """The runtime's answer for the client's, or ``None`` (fail closed: deny, and cancel the
    run) for anything but a clean allow-once or reject-once."""
    outcome = response.outcome
    if isinstance(outcome, SelectedPermissionOutcome):
        return _ANSWERS.get(outcome.option_id)
    return None


def stop_reason(state: RunState, reason: StopReason) -> WireStopReason:
    """ACP's stop reason of a finished run. A completed run gives the backend's reason; a
    failed one ``end_turn``: its failure text was already shown as agent text, and answering
    normally keeps a client from retrying work that may have had effects."""
    if state is RunState.CANCELLED:
        return "cancelled"
    if state is RunState.COMPLETED:
        return _COMPLETED_REASONS[reason]
    return "end_turn"


class Projection(Protocol):
    """Builds every update of one session (and keeps what that needs, e.g. announced tools).

    ``text_line`` is the streaming hot path: the one finished line of a text chunk, or
    ``None`` when :meth:`text` must build it."""

    def text_line(self, kind: ChunkKind, message_id: str, text: str) -> bytes | None: ...

    def text(self, kind: ChunkKind, message_id: str, text: str) -> list[bytes]: ...

    def notice(self, message_id: str, text: str) -> list[bytes]: ...

    def event(self, event: RunEvent) -> Outbound | list[bytes] | None:
        """The update(s) of a run event other than text, a permission request and the end."""
        ...

    def shell_output(self, output: ShellOutput) -> list[Outbound]:
        """A command's live output on its tool call (a snapshot; the last one at its exit)."""
        ...

    def tool(self, tool_id: str, tool: ToolState, *, summary: str = "") -> Outbound:
        """A tool call's row (a background command's final row, outside any turn)."""
        ...

    def title(self, title: str) -> Outbound: ...

    def goal(self, goal: GoalRecord | None) -> Outbound: ...

    def commands(self, commands: Sequence[CommandInfo]) -> Outbound: ...

    def config_update(self, options: ConfigOptions) -> Outbound: ...

    def mode_change(self, mode_id: str, options: ConfigOptions) -> list[Outbound]:
        """What a change of the session's mode announces (its config options with it)."""
        ...

    def history(
        self, rows: Sequence[TimelineItem | MessageRow]
    ) -> Iterable[Outbound | ImageSlot]: ...

    def image(self, message_id: str, image: ImageRef, data: bytes) -> Outbound:
        """A user message's image, as a replay shows it."""
        ...

    def image_placeholder(self, message_id: str, image: ImageRef, why: str) -> list[bytes]:
        """The text a replay shows for an image it cannot send."""
        ...

    def permission_request(self, request: ToolRequest) -> PermissionQuestion:
        """The client method's request that asks about ``request`` (the channel sends it)."""
        ...

    def question(
        self, question_id: str, title: str, options: Sequence[PermissionOption]
    ) -> PermissionQuestion:
        """A permission request that is a question of the agent's own (no tool call)."""
        ...

    # The turn's frame. Each returns the updates to send (none in a version without them).

    def accepted(self, message_id: str, text: str) -> list[Outbound]:
        """A prompt's user message was inserted as ``message_id``."""
        ...

    def run_started(self) -> list[Outbound]: ...

    def run_ended(self, state: RunState, reason: StopReason) -> list[Outbound]:
        """The last updates of a run, after every other one."""
        ...

    def permission_waiting(self) -> list[Outbound]: ...

    def permission_settled(self) -> list[Outbound]: ...

    def attached(self, running: bool) -> list[Outbound]:
        """The current state, sent by a resume before its answer."""
        ...

    def replay_complete(self) -> list[Outbound]:
        """The end of a replay a resume asked for, its last update before the answer (in a
        version whose resume replays)."""
        ...

    def turn_ended(
        self, state: RunState, usage: Usage | None, reason: StopReason
    ) -> list[Outbound]:
        """The end of a turn a steering message started, after its ``run_ended`` frames: in a
        version whose prompt answer ends a turn, what that answer would have carried."""
        ...


class NoTurnFrames:
    """For a version whose turn is framed by its answer alone: no frame updates."""

    def accepted(self, message_id: str, text: str) -> list[Outbound]:
        return []

    def run_started(self) -> list[Outbound]:
        return []

    def run_ended(self, state: RunState, reason: StopReason) -> list[Outbound]:
        return []

    def permission_waiting(self) -> list[Outbound]:
        return []

    def permission_settled(self) -> list[Outbound]:
        return []

    def attached(self, running: bool) -> list[Outbound]:
        return []

    def replay_complete(self) -> list[Outbound]:
        return []


class Dialect(Protocol):
    """One protocol version. See the module docstring."""

    @property
    def version(self) -> int: ...

    @property
    def routes(self) -> Mapping[str, Route]: ...

    @property
    def answers_on_acceptance(self) -> bool:
        """A prompt is answered once its message is inserted (:meth:`acceptance_answer`);
        the turn goes on and ends in updates. Otherwise the answer ends the turn."""
        ...

    @property
    def accepts_batches(self) -> bool:
        """A top-level array on the stream is a JSON-RPC batch (else it is refused)."""
        ...

    @property
    def chunk_kinds(self) -> Mapping[type, ChunkKind]:
        """The update kind of each text event type (``TextChunk``, ``ThoughtChunk``)."""
        ...

    def projection(
        self,
        session_id: str,
        *,
        notices: bool = False,
        compaction: bool = False,
        plans: bool = False,
    ) -> Projection:
        """A session's updates; ``notices``: the client shows notice updates; ``compaction``:
        it follows compactions (else it is sent none); ``plans``: it takes plan operations
        (else the legacy ``plan``; a version whose baseline has them ignores it)."""
        ...

    def client_features(self, request: InitializeParams) -> ClientFeatures:
        """What the client takes, from its ``initialize`` request."""
        ...

    def initialize_answer(self, answer: InitializeResponse) -> object:
        """This version's ``initialize`` answer, from the host's (version 1) one."""
        ...

    def replay_requested(self, request: ResumeParams) -> bool:
        """Whether a ``session/resume`` asks for the history (``-32602`` for a cursor this
        agent cannot serve)."""
        ...

    def new_answer(
        self, session_id: str, options: ConfigOptions, settings: SessionSettings
    ) -> object: ...

    def load_answer(self, options: ConfigOptions, settings: SessionSettings) -> object: ...

    def fork_answer(
        self, session_id: str, options: ConfigOptions, settings: SessionSettings
    ) -> object: ...

    def resume_answer(self, options: ConfigOptions, settings: SessionSettings) -> object: ...

    def prompt_answer(
        self, state: RunState, usage: Usage | None = None, reason: StopReason = ...
    ) -> object:
        """A prompt's answer: stop reason and exactly this turn's usage."""
        ...

    def acceptance_answer(self, message_id: str) -> object:
        """The prompt's answer once its message is inserted (see
        :attr:`answers_on_acceptance`)."""
        ...

    def steering_answer(
        self, outcome: Literal["injected", "startedNewTurn", "promptRequired"], reason: str | None
    ) -> object:
        """The answer to ``_session/steering``."""
        ...

    def mode_answer(self) -> object:
        """The answer to a mode change the runtime accepted."""
        ...

    def config_answer(self, options: ConfigOptions) -> object: ...
