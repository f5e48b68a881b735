"""``initialize``: protocol version, both sides' capabilities and implementation info.

Capability objects carry only what ACP v1 defines; anything else a peer sends is ignored.
"""

import attrs

from ._content import Meta
from ._validators import WireValueError, non_negative


def _protocol_version(instance: object, attribute: object, value: int) -> None:
    if not 0 <= value <= 0xFFFF:
        raise WireValueError("expected an integer from 0 to 65535", field="protocolVersion")


@attrs.frozen(kw_only=True)
class Implementation:
    name: str
    version: str
    title: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class FileSystemCapabilities:
    read_text_file: bool = False
    write_text_file: bool = False
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class AuthCapabilities:
    terminal: bool = False
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class BooleanConfigOptionCapabilities:
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionConfigOptionsCapabilities:
    boolean: BooleanConfigOptionCapabilities | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class NoticeCapabilities:
    """Present (as ``{}``) when the client shows ``notice`` updates to its user."""


@attrs.frozen(kw_only=True)
class CompactionCapabilities:
    """Present (as ``{}``) when the client follows compaction updates."""


@attrs.frozen(kw_only=True)
class ClientSessionCapabilities:
    config_options: SessionConfigOptionsCapabilities | None = None
    notices: NoticeCapabilities | None = None
    compaction: CompactionCapabilities | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ElicitationFormCapabilities:
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ElicitationUrlCapabilities:
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ElicitationCapabilities:
    #: Present when the client can answer ``elicitation/create`` in form mode.
    form: ElicitationFormCapabilities | None = None
    url: ElicitationUrlCapabilities | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class PlanCapabilities:
    """Present when the client takes ``plan_update`` and ``plan_removed`` (v1 1.29, unstable)."""

    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SubagentCapabilities:
    """Present when the client shows child sessions: ``subagent_update`` and
    ``session_message`` (v1 1.29, unstable)."""

    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ClientCapabilities:
    fs: FileSystemCapabilities = FileSystemCapabilities()
    terminal: bool = False
    session: ClientSessionCapabilities | None = None
    auth: AuthCapabilities = AuthCapabilities()
    elicitation: ElicitationCapabilities | None = None
    plan: PlanCapabilities | None = None
    subagents: SubagentCapabilities | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class InitializeRequest:
    protocol_version: int = attrs.field(validator=[non_negative, _protocol_version])
    client_capabilities: ClientCapabilities = ClientCapabilities()
    client_info: Implementation | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class PromptCapabilities:
    image: bool = False
    audio: bool = False
    embedded_context: bool = False
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class McpCapabilities:
    http: bool = False
    sse: bool = False
    acp: bool = False
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionListCapabilities:
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionCloseCapabilities:
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionDeleteCapabilities:
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionResumeCapabilities:
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionForkCapabilities:
    """``session/fork`` is served (unstable schema)."""

    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionAdditionalDirectoriesCapabilities:
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionCapabilities:
    list: SessionListCapabilities | None = None
    close: SessionCloseCapabilities | None = None
    delete: SessionDeleteCapabilities | None = None
    resume: SessionResumeCapabilities | None = None
    additional_directories: SessionAdditionalDirectoriesCapabilities | None = None
    fork: SessionForkCapabilities | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class LogoutCapabilities:
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class AgentAuthCapabilities:
    logout: LogoutCapabilities | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class AgentCapabilities:
    load_session: bool = False
    prompt_capabilities: PromptCapabilities = PromptCapabilities()
    mcp_capabilities: McpCapabilities = McpCapabilities()
    session_capabilities: SessionCapabilities = SessionCapabilities()
    auth: AgentAuthCapabilities | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class AuthMethod:
    """An agent-handled authentication method (the schema's ``AuthMethodAgent``)."""

    id: str
    name: str
    description: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class InitializeResponse:
    protocol_version: int = attrs.field(validator=[non_negative, _protocol_version])
    agent_capabilities: AgentCapabilities = AgentCapabilities()
    auth_methods: tuple[AuthMethod, ...] = ()
    agent_info: Implementation | None = None
    #: ``_meta.goal`` advertises the goal extension (see :class:`GoalCapability`).
    meta: Meta | None = None
