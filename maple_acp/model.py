"""The plain records of the library: tasks, history items, tool states, plans, usage, goals,
commands, tool specs, session modes, tool categories and prompt images.

Plain frozen values that depend on nothing else in the package. The store persists them (and
assigns nothing but ``seq``), the runtime hands them to backends and re-exports them, and the
edge projects them; none of them knows ACP.
"""

from __future__ import annotations

import enum
from typing import Any, Final, NamedTuple

import attrs


class TaskPolicy(enum.StrEnum):
    """How a task's tool requests are decided."""

    #: Tool requests the host's classifier does not cover go to the run's caller. The only
    #: policy an external surface may list or load.
    CALLER_MEDIATED = "caller_mediated"
    #: The host's own unattended mode; invisible to external surfaces.
    AUTO = "auto"


class TaskSurface(enum.StrEnum):
    """Which kind of caller created the task."""

    EXTERNAL = "external"
    DESKTOP = "desktop"


class ItemKind(enum.StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    THOUGHT = "thought"
    TOOL = "tool"
    #: A whole plan as the backend last sent it; the latest one of a task is replayed.
    PLAN = "plan"
    #: A compaction's summary (the item id is the compaction's): a backend's later requests
    #: carry it in place of the history before the turn it happened in. The rows before it
    #: stay, and are replayed as ever.
    COMPACTION = "compaction"


#: The kinds of a plain message row (the others are tool calls and plans).
MESSAGE_KINDS: Final = (ItemKind.USER, ItemKind.ASSISTANT, ItemKind.THOUGHT)


class ToolStatus(enum.StrEnum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (ToolStatus.COMPLETED, ToolStatus.FAILED, ToolStatus.CANCELLED)


class GoalStatus(enum.StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    BLOCKED = "blocked"
    LIMITED = "limited"
    COMPLETE = "complete"


@attrs.frozen(kw_only=True)
class TaskRecord:
    """One task row. Two records compare equal exactly when the stored rows are equal, which is
    what "confirmed untouched" means for provisional deletion."""

    id: str
    account: str
    #: Canonical absolute project directory.
    root: str
    title: str = ""
    user_renamed: bool = False
    created_ms: int
    updated_ms: int
    policy: TaskPolicy = TaskPolicy.CALLER_MEDIATED
    surface: TaskSurface
    #: The persisted model; locked once the first user message is admitted.
    model: str | None = None
    archived: bool = False
    #: External tasks stay provisional (hidden from lists) until their first admitted message.
    provisional: bool = False
    #: When a released-but-unclosed provisional task may be swept; ``None`` = no grace running.
    provisional_expires_ms: int | None = None
    #: The id of the session mode chosen for the task; ``None`` = the host's default mode.
    mode: str | None = None
    #: The thinking effort chosen for the task (one of the backend's levels for its model);
    #: ``None`` = the backend's own default.
    thought_level: str | None = None
    #: Canonical absolute directories the task may work in besides ``root``.
    additional_directories: tuple[str, ...] = ()
    #: The boolean options set for the task (option id, value), in id order; an option the
    #: backend declares and the task never set has the backend's default.
    boolean_options: tuple[tuple[str, bool], ...] = ()
    #: A child session's parent task (``None``: a session of its own). A child is reached
    #: only through its parent: it is not listed, loaded or deleted alone.
    parent_id: str | None = None
    #: The parent's tool call that delegated to this child (where its transcript is replayed).
    parent_tool_id: str | None = None


class PlanPriority(enum.StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class PlanStatus(enum.StrEnum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


@attrs.frozen(kw_only=True)
class PlanEntry:
    """One step of a backend's plan."""

    content: str
    priority: PlanPriority = PlanPriority.MEDIUM
    status: PlanStatus = PlanStatus.PENDING


@attrs.frozen(kw_only=True)
class FileDiff:
    """A file edit a tool made or proposes."""

    #: Absolute path of the file.
    path: str
    new_text: str
    #: ``None`` for a file the edit creates.
    old_text: str | None = None
    #: True when the texts were cut to a bound, so a reader must not treat them as whole.
    truncated: bool = False


@attrs.frozen(kw_only=True)
class ToolLocation:
    """A place in a file a tool touched."""

    #: Absolute path (a relative one means nothing to a reader that does not know the tool's
    #: working directory; the edge drops it).
    path: str
    #: Line number, when the tool knows it.
    line: int | None = None


@attrs.frozen(kw_only=True)
class ToolState:
    """The request and, once known, the terminal result of one tool call."""

    name: str
    status: ToolStatus
    title: str = ""
    #: JSON-ready values; the store persists them as JSON text.
    raw_input: Any = None
    raw_output: Any = None
    #: Text of the terminal result, preferred over the request summary when history is replayed.
    output_text: str | None = None
    #: Files the tool touched, when known.
    locations: tuple[ToolLocation, ...] = ()
    #: File edits the tool made or proposes.
    diffs: tuple[FileDiff, ...] = ()


@attrs.frozen(kw_only=True)
class ImageRef:
    """An image a user message carries, by its content: the bytes are stored once per
    ``sha256`` (the store's blobs) and read back when a backend or a replay needs them."""

    #: Lowercase hex SHA-256 of the decoded bytes.
    sha256: str
    #: ``image/png``, ``image/jpeg``, ``image/gif`` or ``image/webp`` (as the bytes say).
    mime_type: str
    #: Decoded size in bytes.
    size: int
    #: Pixel dimensions, when the image's header states them.
    width: int | None = None
    height: int | None = None
    #: Where the client said the image came from, if it did.
    uri: str | None = None


@attrs.frozen(kw_only=True)
class TimelineItem:
    """One visible row of a task's history, identified by a stable ``item_id`` within the task
    (the message id for text rows, the tool call id for tool rows)."""

    item_id: str
    kind: ItemKind
    created_ms: int
    run_id: str | None = None
    #: Message text for user/assistant/thought rows; the request summary for tool rows; a
    #: Markdown plan for a ``PLAN`` row (empty for a checklist).
    text: str = ""
    tool: ToolState | None = None
    #: The whole checklist plan, for a row of kind ``PLAN`` (empty otherwise, and for a
    #: Markdown plan or a cleared one).
    plan: tuple[PlanEntry, ...] = ()
    #: The images of a ``USER`` row, in the order the prompt gave them (its text comes first).
    images: tuple[ImageRef, ...] = ()
    #: The provider's signature of a ``THOUGHT`` row's thinking (Anthropic's thinking blocks
    #: are accepted back only with it, verbatim); ``None`` for an unsigned thought.
    signature: str | None = None
    #: Assigned by the store on first insert; ordering of history. 0 for an item not yet stored.
    seq: int = 0


class MessageRow(NamedTuple):
    """A message row of a history as a replay reads it (``MessageRow(ItemKind.ASSISTANT, "m1",
    "Hello")``). Nearly every row of a long history is a message, and a store can hand these
    out straight from its rows, without building a ``TimelineItem`` for each."""

    #: ``ItemKind.USER``, ``ASSISTANT`` or ``THOUGHT``.
    kind: ItemKind
    item_id: str
    text: str


@attrs.frozen(kw_only=True)
class Usage:
    """Token usage of exactly one run (never cumulative across runs)."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )


@attrs.frozen(kw_only=True)
class GoalRecord:
    """The persistent goal of one task (session state, independent of prompt activity)."""

    objective: str
    status: GoalStatus
    iterations: int = 0
    last_reason: str | None = None
    created_ms: int
    updated_ms: int
    token_budget: int | None = None
    tokens_used: int | None = None


@attrs.frozen(kw_only=True)
class TaskQuery:
    """A page request over one account's tasks, newest (``updated_ms``) first."""

    account: str
    #: Exact canonical root to match, or ``None`` for every root.
    root: str | None = None
    policy: TaskPolicy | None = None
    include_provisional: bool = False
    include_archived: bool = False
    #: Opaque cursor from a previous page's ``next_cursor``.
    cursor: str | None = None
    limit: int = 100


@attrs.frozen(kw_only=True)
class TaskPage:
    tasks: tuple[TaskRecord, ...]
    #: ``None`` on the last page.
    next_cursor: str | None = None


@attrs.frozen(kw_only=True)
class CommandInfo:
    """A command a backend offers its callers (a prompt starting with ``/name``)."""

    name: str
    #: One line.
    description: str
    #: What to type after the name, when the command takes input.
    input_hint: str | None = None


@attrs.frozen(kw_only=True)
class ToolSpec:
    """A tool a turn may offer the model."""

    name: str
    description: str
    #: A JSON schema object a provider API accepts (``type: object``, ``properties``,
    #: ``required``).
    input_schema: dict[str, Any]


class ToolCategory(enum.StrEnum):
    """What a tool does, as a session mode judges it."""

    #: Reads only (files, listings, searches).
    READ = "read"
    #: Writes or edits files.
    EDIT = "edit"
    #: Runs commands (a shell).
    EXECUTE = "execute"
    #: Calls a tool of the caller's MCP servers (``external_mcp``).
    EXTERNAL = "external"
    #: Updates the plan shown to the user (``update_plan``).
    PLAN = "plan"
    #: Anything the runtime cannot place: the strict modes refuse it.
    OTHER = "other"


@attrs.frozen(kw_only=True)
class SessionMode:
    """A mode a session can be in, as a client lists it."""

    #: Stable id (``ask``, ``code``, ``plan``, ``auto-edit``, or a host's own).
    id: str
    #: Short display name.
    name: str
    #: One line saying what the mode lets the agent do.
    description: str = ""
