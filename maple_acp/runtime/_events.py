"""What a run reports: its run events, one ordered stream per run (a lease's session events,
outside any prompt, are in ``_session_events``)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

import attrs

from maple_acp.model import CommandInfo, PlanEntry, ToolState, Usage
from maple_acp.runtime._live_output import ShellOutput

if TYPE_CHECKING:
    from maple_acp.runtime._permissions import (
        PermissionResponder,
        PermissionTicket,
        ToolRequest,
    )


class RunState(enum.Enum):
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"


class RunKind(enum.Enum):
    #: A turn started by a caller's prompt (its user message was admitted first).
    PROMPT = "prompt"
    #: An autonomous goal cycle started by the runtime while the task was quiescent.
    GOAL_CYCLE = "goal_cycle"


class StopReason(enum.StrEnum):
    """Why a completed turn stopped, as the backend reports it (``TurnResult.stop_reason``)."""

    #: The model finished its answer.
    END_TURN = "end_turn"
    #: The model hit its output token limit.
    MAX_TOKENS = "max_tokens"
    #: The backend's bound on model requests in one turn was reached.
    MAX_TURN_REQUESTS = "max_turn_requests"
    #: The model (or its provider) refused to go on.
    REFUSAL = "refusal"


@attrs.frozen(kw_only=True)
class RunOutcome:
    """The retained terminal state of one run."""

    state: RunState
    #: For a failed run: one bounded line (≤ 500 chars) saying why; else ``None``.
    failure: str | None = None
    #: Token usage of exactly this run (never cumulative across runs).
    usage: Usage = attrs.field(factory=Usage)
    #: The backend reported usage: without it ``usage`` is all zeros, which are not counts.
    usage_reported: bool = False
    #: The run was cancelled because its event queue overflowed.
    overflowed: bool = False
    #: For a completed run: why the backend's turn stopped (``END_TURN`` otherwise).
    stop_reason: StopReason = StopReason.END_TURN


@attrs.frozen
class TextChunk:
    """A piece of agent message text; chunks of one message share ``message_id``, which is also
    the message's id in the task history."""

    run_id: str
    message_id: str
    text: str


@attrs.frozen
class ThoughtChunk:
    """A piece of agent reasoning text, with the same id rules as ``TextChunk``."""

    run_id: str
    message_id: str
    text: str


@attrs.frozen
class ToolRow:
    """One state of a tool call. ``first`` is true for the first row of ``tool_id`` in this
    run; later rows of the same id carry the updated state."""

    run_id: str
    tool_id: str
    first: bool
    tool: ToolState


@attrs.frozen
class ToolOutput:
    """A command's output while it runs, on its tool call (``output.tool_id``): snapshots at
    most every 100 ms, coalesced while the caller is slow, the last one at its exit. Not
    stored: the tool call's final row is."""

    run_id: str
    output: ShellOutput


@attrs.frozen
class PermissionRequest:
    """The run waits for its caller's decision on ``request``: answer through ``responder``
    (or ``Run.answer`` with ``responder.id``). Only allow-once and deny-once exist. Read
    through the lease (``run.event_batches()``), ``responder`` is each window's ticket on the
    question the lease's holder and observers share: the first clean answer decides it."""

    run_id: str
    responder: PermissionResponder | PermissionTicket
    request: ToolRequest


@attrs.frozen
class UsageUpdate:
    """Token usage of this run so far."""

    run_id: str
    usage: Usage


@attrs.frozen
class TitleChanged:
    run_id: str
    title: str


@attrs.frozen
class PlanUpdated:
    """The backend's whole plan, as it stands now (each update replaces the previous one):
    a checklist (``entries``) or Markdown (``markdown``); neither is a cleared plan."""

    run_id: str
    entries: tuple[PlanEntry, ...]
    markdown: str = ""


@attrs.frozen
class ContextUsage:
    """How much of the model's context window is in use (``used`` may exceed ``size``), and
    the session's cumulative cost in USD when the backend knows the model's prices."""

    run_id: str
    used: int
    size: int
    cost_usd: float | None = None


@attrs.frozen
class CommandsChanged:
    """The backend's available commands changed; ``commands`` is the whole new list."""

    run_id: str
    commands: tuple[CommandInfo, ...]


#: How much a notice matters to the user: ``info``, ``warning`` or ``error``.
NoticeLevel: TypeAlias = Literal["info", "warning", "error"]
NOTICE_LEVELS: Final[tuple[NoticeLevel, ...]] = ("info", "warning", "error")


#: How a caller that does not show notices sees one: as visible agent ``text``, or as a
#: ``thought`` (what the agent is going through, e.g. waiting on its provider).
NoticeFallback: TypeAlias = Literal["text", "thought"]


@attrs.frozen
class RunNotice:
    """A message for the caller about the run itself (not agent text), with its ``level``.
    ``terminal`` notices come right before ``RunEnded``: the failure text of a failed run, or
    the overflow notice. ``fallback`` says how a caller that does not show notices sees it."""

    run_id: str
    text: str
    terminal: bool = False
    level: NoticeLevel = "info"
    fallback: NoticeFallback = "text"


#: Where a compaction stands: ``in_progress``, then ``completed``, ``failed`` or ``cancelled``.
CompactionStatus: TypeAlias = Literal["in_progress", "completed", "failed", "cancelled"]


@attrs.frozen
class CompactionChanged:
    """A compaction of the conversation started or ended (``status``); ``error`` says why one
    failed. Only a caller that follows compactions shows it."""

    run_id: str
    compaction_id: str
    status: CompactionStatus
    error: str | None = None


@attrs.frozen
class CompactionText:
    """A piece of a running compaction's summary."""

    run_id: str
    compaction_id: str
    text: str


@attrs.frozen
class RunEnded:
    """Always the last event of a run."""

    run_id: str
    outcome: RunOutcome


@attrs.frozen
class ChildAnnounced:
    """The run delegated to a child session (``child_id``, a task of its own whose parent is
    this run's task) from its tool call ``tool_id``: ``prompt`` is what the child was asked.
    It runs once a place among the running children is free (``ChildRunning``)."""

    run_id: str
    child_id: str
    tool_id: str
    title: str
    prompt: str
    #: The id of the delegation prompt in the child's history (its user message).
    prompt_message_id: str


@attrs.frozen
class ChildRunning:
    """A child announced by this run started its turn."""

    run_id: str
    child_id: str


@attrs.frozen
class ChildEvent:
    """One event of a child's own run (its text, tool calls, permission questions, its end),
    in the child's order: ``event.run_id`` is the child's run."""

    run_id: str
    child_id: str
    event: RunEvent


@attrs.frozen
class ChildEnded:
    """A child's turn ended with ``outcome``; ``answer`` is what its parent's tool call
    returns (its final answer, or why there is none), ``answer_message_id`` its id in the
    child's history (empty when the child said nothing)."""

    run_id: str
    child_id: str
    outcome: RunOutcome
    answer: str
    answer_message_id: str


#: What a run reports about a child session it delegated to.
ChildReport: TypeAlias = ChildAnnounced | ChildRunning | ChildEvent | ChildEnded

RunEvent: TypeAlias = (
    TextChunk
    | ThoughtChunk
    | ToolRow
    | ToolOutput
    | PermissionRequest
    | UsageUpdate
    | TitleChanged
    | PlanUpdated
    | ContextUsage
    | CommandsChanged
    | RunNotice
    | CompactionChanged
    | CompactionText
    | ChildAnnounced
    | ChildRunning
    | ChildEvent
    | ChildEnded
    | RunEnded
)
