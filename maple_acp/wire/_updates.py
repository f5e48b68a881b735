"""``session/update`` notifications and the tool-call, plan and command shapes they carry.

The variant classes carry no ``sessionUpdate`` field: the tag is written and read by the
converter where a :data:`SessionUpdate` is expected, so :class:`ToolCallUpdate` also serves,
untagged, as the tool call of a permission request.
"""

from typing import Any, Literal

import attrs

from ._content import ContentBlock, Meta
from ._session import SessionConfigOption
from ._validators import non_empty, non_negative

ToolKind = Literal[
    "read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"
]
ToolCallStatus = Literal["pending", "in_progress", "completed", "failed"]


@attrs.frozen(kw_only=True)
class UserMessageChunk:
    content: ContentBlock
    message_id: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class AgentMessageChunk:
    content: ContentBlock
    message_id: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class AgentThoughtChunk:
    content: ContentBlock
    message_id: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class Content:
    """Tool-call content that is a plain content block."""

    content: ContentBlock
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class Diff:
    path: str
    new_text: str
    old_text: str | None = None
    meta: Meta | None = None


#: Tagged on ``type``: content, diff (ACP's ``terminal`` content needs client terminals, which
#: this agent does not use).
ToolCallContent = Content | Diff


@attrs.frozen(kw_only=True)
class ToolCallLocation:
    path: str
    line: int | None = attrs.field(default=None, validator=non_negative)
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ToolCall:
    """The first report of a tool call (``sessionUpdate: "tool_call"``)."""

    tool_call_id: str
    title: str
    #: The tool's stable programmatic name (the title is for people).
    name: str | None = None
    kind: ToolKind | None = None
    status: ToolCallStatus | None = None
    content: tuple[ToolCallContent, ...] | None = None
    locations: tuple[ToolCallLocation, ...] | None = None
    raw_input: Any = None
    raw_output: Any = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ToolCallUpdate:
    """A later report of a tool call; only the fields that changed are set."""

    tool_call_id: str
    title: str | None = None
    name: str | None = None
    kind: ToolKind | None = None
    status: ToolCallStatus | None = None
    content: tuple[ToolCallContent, ...] | None = None
    locations: tuple[ToolCallLocation, ...] | None = None
    raw_input: Any = None
    raw_output: Any = None
    meta: Meta | None = None


PlanEntryPriority = Literal["high", "medium", "low"]
PlanEntryStatus = Literal["pending", "in_progress", "completed"]


@attrs.frozen(kw_only=True)
class PlanEntry:
    content: str
    priority: PlanEntryPriority
    status: PlanEntryStatus
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class Plan:
    entries: tuple[PlanEntry, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class PlanItems:
    """A checklist plan in a ``plan_update``."""

    type: Literal["items"] = "items"
    plan_id: str
    entries: tuple[PlanEntry, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class PlanMarkdown:
    """A Markdown plan in a ``plan_update``."""

    type: Literal["markdown"] = "markdown"
    plan_id: str
    content: str
    meta: Meta | None = None


#: Told apart by their own ``type`` field (the host only sends them).
PlanUpdateContent = PlanItems | PlanMarkdown


@attrs.frozen(kw_only=True)
class PlanUpdate:
    """The whole plan of one id (v1 1.29's unstable kind, sent to a client that declared
    ``clientCapabilities.plan``; v2's own)."""

    plan: PlanUpdateContent
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class PlanRemoved:
    plan_id: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class UnstructuredCommandInput:
    hint: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class AvailableCommand:
    name: str
    description: str
    input: UnstructuredCommandInput | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class AvailableCommandsUpdate:
    available_commands: tuple[AvailableCommand, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class ConfigOptionUpdate:
    config_options: tuple[SessionConfigOption, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class CurrentModeUpdate:
    """The session's mode changed (``sessionUpdate: "current_mode_update"``)."""

    current_mode_id: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SessionInfoUpdate:
    """Title and activity of a session; ``_meta.goal`` carries the goal snapshot."""

    title: str | None = None
    updated_at: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class Cost:
    amount: float
    currency: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class UsageUpdate:
    used: int = attrs.field(validator=non_negative)
    size: int = attrs.field(validator=non_negative)
    cost: Cost | None = None
    meta: Meta | None = None


NoticeSeverity = Literal["info", "warning", "error"]


@attrs.frozen(kw_only=True)
class Notice:
    """Information for the user that is not session history (``sessionUpdate: "notice"``);
    sent only to a client whose ``clientCapabilities.session.notices`` is set."""

    severity: NoticeSeverity
    title: str = attrs.field(validator=non_empty)
    description: str | None = None
    meta: Meta | None = None


CompactionStatus = Literal["in_progress", "completed", "failed", "cancelled"]


@attrs.frozen(kw_only=True)
class CompactionUpdate:
    """A context compaction created or updated (``sessionUpdate: "compaction_update"``); sent
    only to a client whose ``clientCapabilities.session.compaction`` is set."""

    compaction_id: str
    status: CompactionStatus
    #: The whole summary, replacing any earlier one (``None``: left as it is).
    summary: tuple[ContentBlock, ...] | None = None
    error: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class CompactionSummaryChunk:
    """A piece of a compaction's summary (``sessionUpdate: "compaction_summary_chunk"``)."""

    compaction_id: str
    content: ContentBlock
    meta: Meta | None = None


#: Tagged on ``sessionUpdate`` with the snake_case name of each variant.
SessionUpdate = (
    UserMessageChunk
    | AgentMessageChunk
    | AgentThoughtChunk
    | ToolCall
    | ToolCallUpdate
    | Plan
    | PlanUpdate
    | PlanRemoved
    | AvailableCommandsUpdate
    | ConfigOptionUpdate
    | CurrentModeUpdate
    | SessionInfoUpdate
    | UsageUpdate
    | Notice
    | CompactionUpdate
    | CompactionSummaryChunk
)


@attrs.frozen(kw_only=True)
class SessionNotification:
    """Params of ``session/update``."""

    session_id: str
    update: SessionUpdate
    meta: Meta | None = None
