"""Session lifecycle messages: new, load, list, prompt, cancel, close, modes and config options."""

from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from ._content import ContentBlock, Meta
from ._validators import WireValueError, non_negative


@attrs.frozen(kw_only=True)
class HttpHeader:
    name: str
    value: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class EnvVariable:
    name: str
    value: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class McpServerHttp:
    name: str
    url: str
    headers: tuple[HttpHeader, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class McpServerSse:
    name: str
    url: str
    headers: tuple[HttpHeader, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class McpServerStdio:
    name: str
    command: str
    args: tuple[str, ...]
    env: tuple[EnvVariable, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class McpServerAcp:
    """A server that lives in the client: the agent speaks MCP to it through ``mcp/message``
    requests on the connection that declared it (unstable schema)."""

    name: str
    server_id: str
    meta: Meta | None = None


#: ``type`` is ``http``, ``sse`` or ``acp``; a stdio server carries no ``type`` (``"stdio"`` is
#: accepted).
McpServer = McpServerHttp | McpServerSse | McpServerStdio | McpServerAcp
#: The members of :data:`McpServer` by their ``type`` (the converter's table).
MCP_SERVER_TYPES: Final[Mapping[str, type]] = {
    "http": McpServerHttp,
    "sse": McpServerSse,
    "stdio": McpServerStdio,
    "acp": McpServerAcp,
}


@attrs.frozen(kw_only=True)
class SessionMode:
    id: str
    name: str
    description: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionModeState:
    current_mode_id: str
    available_modes: tuple[SessionMode, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionConfigSelectOption:
    value: str
    name: str
    description: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionConfigSelect:
    """A select option (model, mode, thinking effort); its options are a flat list."""

    type: Literal["select"] = "select"
    id: str
    name: str
    current_value: str
    options: tuple[SessionConfigSelectOption, ...]
    description: str | None = None
    #: ``mode``, ``model``, ``model_config``, ``thought_level`` or any other string.
    category: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionConfigBoolean:
    """An on/off option (a backend's boolean option), sent only to a client that declared
    ``clientCapabilities.session.configOptions.boolean``."""

    type: Literal["boolean"] = "boolean"
    id: str
    name: str
    current_value: bool
    description: str | None = None
    category: str | None = None
    meta: Meta | None = None


#: A config option this agent sends: a select, or a boolean.
SessionConfigOption = SessionConfigSelect | SessionConfigBoolean


@attrs.frozen(kw_only=True)
class NewSessionRequest:
    cwd: str
    mcp_servers: tuple[McpServer, ...]
    additional_directories: tuple[str, ...] = ()
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class NewSessionResponse:
    session_id: str
    modes: SessionModeState | None = None
    config_options: tuple[SessionConfigOption, ...] | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class LoadSessionRequest:
    session_id: str
    cwd: str
    mcp_servers: tuple[McpServer, ...]
    additional_directories: tuple[str, ...] = ()
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class LoadSessionResponse:
    modes: SessionModeState | None = None
    config_options: tuple[SessionConfigOption, ...] | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ResumeSessionRequest:
    """``session/resume``: ``session/load`` without the history replay."""

    session_id: str
    cwd: str
    mcp_servers: tuple[McpServer, ...] = ()
    additional_directories: tuple[str, ...] = ()
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ResumeSessionResponse:
    modes: SessionModeState | None = None
    config_options: tuple[SessionConfigOption, ...] | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ForkSessionRequest:
    """``session/fork`` (unstable schema). A ``systemPrompt`` is refused: clients send one
    only to an agent that advertises ``sessionCapabilities.systemPrompt``, which this one does
    not. The message a fork's history ends at goes in ``_meta.messageId``."""

    session_id: str
    cwd: str
    additional_directories: tuple[str, ...] = ()
    mcp_servers: tuple[McpServer, ...] = ()
    system_prompt: dict[str, Any] | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ForkSessionResponse:
    session_id: str
    modes: SessionModeState | None = None
    config_options: tuple[SessionConfigOption, ...] | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class DeleteSessionRequest:
    session_id: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class DeleteSessionResponse:
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ListSessionsRequest:
    cwd: str | None = None
    cursor: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionInfo:
    session_id: str
    cwd: str
    title: str | None = None
    #: ISO 8601 timestamp of the last activity.
    updated_at: str | None = None
    additional_directories: tuple[str, ...] | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ListSessionsResponse:
    sessions: tuple[SessionInfo, ...]
    next_cursor: str | None = None
    meta: Meta | None = None


StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]


@attrs.frozen(kw_only=True)
class PromptRequest:
    session_id: str
    prompt: tuple[ContentBlock, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts of one prompt turn (``Usage`` of the unstable schema)."""

    input_tokens: int = attrs.field(validator=non_negative)
    output_tokens: int = attrs.field(validator=non_negative)
    total_tokens: int = attrs.field(validator=non_negative)
    thought_tokens: int | None = attrs.field(default=None, validator=non_negative)
    cached_read_tokens: int | None = attrs.field(default=None, validator=non_negative)
    cached_write_tokens: int | None = attrs.field(default=None, validator=non_negative)
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class PromptResponse:
    stop_reason: StopReason
    usage: Usage | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class CancelNotification:
    session_id: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class CloseSessionRequest:
    session_id: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class CloseSessionResponse:
    meta: Meta | None = None


def _check_config_value(
    instance: "SetSessionConfigOptionRequest", attribute: Any, value: Any
) -> None:
    # The schema pairs a boolean value with ``type: "boolean"`` and a select value with no type.
    if instance.type == "boolean":
        if not isinstance(value, bool):
            raise WireValueError(
                f"{instance.config_id!r} was given type 'boolean' and a value that is not a "
                "boolean",
                field="value",
            )
    elif not isinstance(value, str):
        raise WireValueError(
            f"{instance.config_id!r} was given a value that is not a string "
            "(a boolean needs type 'boolean')",
            field="value",
        )


@attrs.frozen(kw_only=True)
class SetSessionConfigOptionRequest:
    session_id: str
    config_id: str
    type: Literal["boolean"] | None = None
    value: str | bool = attrs.field(validator=_check_config_value)
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SetSessionConfigOptionResponse:
    config_options: tuple[SessionConfigOption, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SetSessionModeRequest:
    session_id: str
    mode_id: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SetSessionModeResponse:
    meta: Meta | None = None
