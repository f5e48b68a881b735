"""ACP v2 (draft 2.0.0-alpha.12) wire types: only the shapes that differ from v1.

Where v2 keeps v1's shape (prompt, list, close, delete, cancel, text chunks, usage, notices,
session info, permission options and answers) the v1 types serve both versions. A type here
is named ``V2`` + its schema definition. Update bodies carry no ``sessionUpdate`` tag: the v2
projection writes it, as the union does for v1.

Open enums: a field the schema leaves open (a replay cursor's ``type``, a config value's
``type``) is read as a plain string here and judged where it is used, so an unknown
``_``-prefixed value is refused or ignored by a rule, never by a failed guess of the converter.
"""

from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from ._content import ContentBlock, Meta
from ._initialize import Implementation
from ._interaction import PermissionOption
from ._session import (
    MCP_SERVER_TYPES,
    HttpHeader,
    McpServerAcp,
    McpServerSse,
    McpServerStdio,
    SessionConfigSelectOption,
)
from ._validators import WireValueError, non_negative


def _protocol_version(instance: object, attribute: object, value: int) -> None:
    if not 0 <= value <= 0xFFFF:
        raise WireValueError("expected an integer from 0 to 65535", field="protocolVersion")


# --- inbound ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class V2InitializeRequest:
    """``info`` and ``capabilities`` are read leniently (the schema's default-on-error):
    they only describe the client, so a malformed one is treated as absent."""

    protocol_version: int = attrs.field(validator=[non_negative, _protocol_version])
    info: Any = None
    capabilities: Any = None
    meta: Meta | None = None

    @property
    def elicitation_form(self) -> bool:
        caps = self.capabilities
        elicitation = caps.get("elicitation") if isinstance(caps, dict) else None
        return isinstance(elicitation, dict) and isinstance(elicitation.get("form"), dict)


@attrs.frozen(kw_only=True)
class V2McpServerHttp:
    """v1's HTTP server, except that ``headers`` may be left out (none)."""

    name: str
    url: str
    headers: tuple[HttpHeader, ...] = ()
    meta: Meta | None = None


#: ``type`` is ``http``, ``stdio`` or ``acp`` (``sse`` too, to be refused as on v1).
V2McpServer = V2McpServerHttp | McpServerSse | McpServerStdio | McpServerAcp
#: The members of :data:`V2McpServer` by their ``type`` (the converter's table).
V2_MCP_SERVER_TYPES: Final[Mapping[str, type]] = {**MCP_SERVER_TYPES, "http": V2McpServerHttp}


@attrs.frozen(kw_only=True)
class V2NewSessionRequest:
    cwd: str
    mcp_servers: tuple[V2McpServer, ...] = ()
    additional_directories: tuple[str, ...] = ()
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2ResumeSessionRequest:
    """``replay_from`` is kept raw: the dialect accepts ``{"type": "start"}`` and refuses any
    other cursor with ``-32602`` (the schema forbids substituting another)."""

    session_id: str
    cwd: str
    mcp_servers: tuple[V2McpServer, ...] = ()
    additional_directories: tuple[str, ...] = ()
    replay_from: Any = None
    meta: Meta | None = None


#: Characters of a prompt's idempotency key, at most: a key names a retry (a UUID is 36);
#: a longer one is a mistake or an attempt to fill the store.
MAX_IDEMPOTENCY_KEY_CHARS = 256


def _idempotency_key(instance: object, attribute: object, value: str | None) -> None:
    if value is not None and not 0 < len(value) <= MAX_IDEMPOTENCY_KEY_CHARS:
        raise WireValueError(
            f"expected 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters", field="idempotencyKey"
        )


@attrs.frozen(kw_only=True)
class V2PromptRequest:
    """``session/prompt`` with the Preview's ``idempotency_key``: a prompt sent again with the
    same key inserts its message once."""

    session_id: str
    prompt: tuple[ContentBlock, ...]
    idempotency_key: str | None = attrs.field(default=None, validator=_idempotency_key)
    meta: Meta | None = None


#: The value kinds of a config change this agent serves: a select's value id, or a boolean.
CONFIG_VALUE_TYPES = frozenset({"id", "boolean"})


def _config_value_type(instance: object, attribute: object, value: str) -> None:
    if value not in CONFIG_VALUE_TYPES:
        raise WireValueError("no option of this agent takes this value type", field="type")


@attrs.frozen(kw_only=True)
class V2SetSessionConfigOptionRequest:
    """``type`` says how ``value`` reads (``id``, ``boolean``, or a later kind: the schema
    leaves it open; this agent serves ``id`` and ``boolean``). Whether the value fits the
    option it names is the edge's to judge (``-32602`` naming the option)."""

    session_id: str
    config_id: str
    type: str = attrs.field(validator=_config_value_type)
    value: Any
    meta: Meta | None = None


# --- outbound -----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class V2McpCapabilities:
    http: Meta | None = None
    stdio: Meta | None = None
    acp: Meta | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2SessionCapabilities:
    """Present (even empty) means the baseline: new, list, resume, close, prompt, cancel."""

    #: ``image`` / ``embeddedContext`` as empty objects when accepted (absent: text and links).
    prompt: dict[str, Any] | None = None
    mcp: V2McpCapabilities | None = None
    delete: Meta | None = None
    additional_directories: Meta | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2AgentCapabilities:
    session: V2SessionCapabilities
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2InitializeResponse:
    protocol_version: int
    info: Implementation
    capabilities: V2AgentCapabilities
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2SessionConfigSelect:
    type: Literal["select"] = "select"
    config_id: str
    name: str
    current_value: str
    options: tuple[SessionConfigSelectOption, ...]
    description: str | None = None
    category: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2SessionConfigBoolean:
    type: Literal["boolean"] = "boolean"
    config_id: str
    name: str
    current_value: bool
    description: str | None = None
    category: str | None = None
    meta: Meta | None = None


#: A config option as v2 shows it.
V2SessionConfigOption = V2SessionConfigSelect | V2SessionConfigBoolean


@attrs.frozen(kw_only=True)
class V2NewSessionResponse:
    session_id: str
    config_options: tuple[V2SessionConfigOption, ...] = ()
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2ResumeSessionResponse:
    config_options: tuple[V2SessionConfigOption, ...] = ()
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2SetSessionConfigOptionResponse:
    config_options: tuple[V2SessionConfigOption, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2PromptResponse:
    """The prompt was inserted: its user message's id (the turn goes on in updates)."""

    message_id: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2StateUpdate:
    """``running``, ``requires_action`` or ``idle`` (with the stop reason)."""

    state: Literal["running", "requires_action", "idle"]
    stop_reason: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2MessageUpsert:
    """A ``user_message`` / ``agent_message`` / ``agent_thought`` update: ``content`` is the
    message's whole content and replaces what the client holds under ``message_id`` (empty:
    a primer its chunks then fill)."""

    message_id: str
    content: tuple[ContentBlock, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2DiffChange:
    operation: Literal["add", "modify"]
    path: str


@attrs.frozen(kw_only=True)
class V2Diff:
    type: Literal["diff"] = "diff"
    changes: tuple[V2DiffChange, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2ToolCallUpdate:
    """An upsert of one tool call: the first one of an id creates it (there is no
    ``tool_call``). ``content`` holds finished content objects (text content, diffs)."""

    tool_call_id: str
    title: str | None = None
    name: str | None = None
    kind: str | None = None
    status: str | None = None
    content: tuple[dict[str, Any], ...] | None = None
    locations: tuple[dict[str, Any], ...] | None = None
    raw_input: Any = None
    raw_output: Any = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2TextCommandInput:
    type: Literal["text"] = "text"
    hint: str


@attrs.frozen(kw_only=True)
class V2Command:
    type: Literal["command"] = "command"
    name: str
    description: str
    input: V2TextCommandInput | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2AvailableCommandsUpdate:
    available_commands: tuple[V2Command, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2ConfigOptionUpdate:
    config_options: tuple[V2SessionConfigOption, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class V2ToolCallSubject:
    type: Literal["tool_call"] = "tool_call"
    tool_call: V2ToolCallUpdate


@attrs.frozen(kw_only=True)
class V2RequestPermissionRequest:
    session_id: str
    title: str
    subject: V2ToolCallSubject | None
    options: tuple[PermissionOption, ...]
    meta: Meta | None = None
