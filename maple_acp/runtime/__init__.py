"""The transport-neutral runtime facade: tasks, runs, events, permissions, models, leases,
project trust and goals. Nothing here knows ACP; the ACP edge and a host's own UI are sibling
callers of this API.

Lifecycle
    ``service = AgentService(store=..., backend=..., catalog=..., policy=...)`` then
    ``await nursery.start(service.serve)`` (or ``async with service:``). ``serve`` sweeps
    stranded provisional tasks before it reports ready, then sweeps expired ones periodically.
    ``service.sign_in(account)`` / ``sign_out()``: a new account starts a new *generation*;
    every lease of the old one is revoked and every operation captured before is refused with
    ``RuntimeRejection(ACCOUNT_CHANGED)``. ``await service.drain()`` stops admitting
    (``SHUTTING_DOWN``) and cancels runs within ``DRAIN_BOUND_S``. ``service.status()`` counts
    leases and active runs; ``service.held_tasks()`` lists the held tasks and what each is
    doing (idle, running, asking for a permission, revoked) for a host's own window.

Rejections
    Every refusal is ``RuntimeRejection`` with ``.kind`` (a ``RejectionKind``) and a safe,
    bounded, one-line ``.message``. A caller maps each kind to one answer. For JSON-RPC:
    ``INVALID_CWD``, ``INVALID_RELAY``, ``INVALID_CURSOR``, ``INVALID_GOAL``, ``UNKNOWN_MODEL``,
    ``MODEL_LOCKED``, ``MODEL_RETIRED``, ``UNKNOWN_MODE``, ``UNKNOWN_THOUGHT_LEVEL`` are bad
    params; ``RUN_ACTIVE``, ``TASK_LEASED``,
    ``WRONG_POLICY``, ``GOAL_STATE``, ``TRUST_BUSY``, ``LEASE_REVOKED`` are state conflicts;
    ``TASK_NOT_FOUND``, ``WRONG_ACCOUNT``, ``ROOT_MISMATCH`` mean an unknown or not-owned task;
    ``NOT_SIGNED_IN``, ``ACCOUNT_CHANGED``, ``SHUTTING_DOWN`` mean the runtime cannot serve.

Leases
    A ``SessionLease`` is one caller's exclusive, revocable hold on one task, served in the
    caller's nursery: ``lease = await nursery.start(service.serve_new_task, cwd, relay=...,
    router_factory=...)`` creates a provisional task; ``await nursery.start(service.serve_task,
    task_id, cwd, ...)`` attaches to an existing one (refusals in order: ``TASK_NOT_FOUND``,
    ``WRONG_ACCOUNT``, ``ROOT_MISMATCH``, ``WRONG_POLICY``, ``RUN_ACTIVE``, ``TASK_LEASED``,
    ``MODEL_RETIRED``). ``router_factory(nursery, task_id)`` runs inside the lease's own nursery
    before the lease is handed out, so a lease-scoped ``ExternalToolRouter`` is connected before
    ownership is committed. The lease's ``ToolContext`` holds the relay values (allow-listed,
    bounded; they reach only children started by ``ToolContext.run_shell``) and the router.
    A tool child's environment is an allow-list of the host's (``PATH``, ``HOME``, ``LC_*``,
    ...; ``AgentService(tool_env_allow=...)`` adds names) plus the relay values: never a
    provider's key, never ``MAPLE_ACP_*``.
    ``service.accept_relay(offered)`` checks a connector's values once (names the host does
    not allow are left out) and gives ``RelayValues`` to pass as ``relay=``. Every tool row,
    permission request, shell output and failure text has each relay value of 8 or more
    characters replaced by ``[relay:NAME]`` before it is stored, sent or logged.
    ``await lease.replace_router(factory)`` re-attaches another set of external tools (the new
    router starts first; on failure the old one stays; ``RUN_ACTIVE`` while a run is active).
    The runtime alone enforces the project directory (canonicalised once, inside
    ``allowed_roots``: ``INVALID_CWD``), one prompt at a time (``with lease.claim_prompt() as
    claim`` holds the slot across a caller's whole prompt; ``RUN_ACTIVE``; ``async with
    lease.queue_prompt(text) as claim`` waits its turn in the session's queue instead: at most
    ``MAX_QUEUED_PROMPTS`` wait, listed by ``lease.queued_prompts``, withdrawn by
    ``remove_queued`` / ``cancel_queued``, each change a ``QueueChanged`` event) and the operation
    barrier (``with lease.operation()``; ``await lease.drain()``).
    ``lease.revoke()`` is synchronous: the run is cancelled, permissions deny, relay values and
    router are dropped, child process groups get SIGTERM. ``await lease.drain()`` is the
    operation barrier; ``await lease.release(close=True|False)`` finishes cleanup (SIGKILL of
    what is left; a close deletes this lease's own never-prompted task if its row is unchanged,
    a disconnect starts the provisional grace period). A revoked lease blocks the task for
    others until its cleanup ends. A caller with a deadline (the ACP close rule) wraps
    cancel + drain + release in one ``trio.move_on_at``; cleanup goes on without it.

Tasks
    ``service.list_tasks(cwd=..., cursor=...)`` pages (≤ 100, opaque cursor) through the
    account's caller-mediated, non-provisional tasks, newest first. ``lease.history()`` (or
    ``service.task_history``) gives the ordered history ready for replay: an ended tool row's
    ``text`` is its terminal output text. ``await service.delete_task(id)`` deletes a task
    durably (``TASK_NOT_FOUND`` for unknown or another account's, ``RUN_ACTIVE`` while a run
    or goal cycle is active, ``TASK_LEASED`` while a lease holds it; trust stays).

Runs and events
    ``run = await lease.start_run(prompt)`` admits the user message durably, then starts the
    backend turn (one active run per task; ``RUN_ACTIVE`` otherwise; a running goal cycle is
    cancelled first). A ``Prompt`` (text, checked images, embedded text resources; a plain
    ``str`` is text only) is the one shape a prompt has from the caller to the turn and the
    stored message. ``async for event in run.events()`` yields ``TextChunk``/``ThoughtChunk``
    (stable ``message_id``), ``ToolRow`` (``first`` for the first row of a tool id),
    ``PermissionRequest``, ``UsageUpdate``, ``TitleChanged``, ``PlanUpdated`` (the whole
    plan), ``ContextUsage`` (context window used/size), ``CommandsChanged``, ``RunNotice``,
    the child sessions it delegated to (``ChildAnnounced``, ``ChildRunning``, each of their
    own events as a ``ChildEvent``, ``ChildEnded``; ``lease.cancel_child(id)`` stops one
    alone) and, last, ``RunEnded``. When a prompt run ends with its task still untitled, the task is
    titled from the first line of its first user message (``TitleChanged`` before
    ``RunEnded``); a backend's own ``turn.set_title`` wins. A failed run's text arrives as a
    terminal ``RunNotice`` before ``RunEnded``. ``run.cancel()``; ``await run.wait()`` gives
    the retained ``RunOutcome`` (state, failure text ≤ 500 chars, this run's usage only).

    Backpressure: a run's queue holds ``RUN_EVENT_QUEUE`` (256) events. The backend's awaited
    sends wait for room, so a slow reader slows the backend with bounded memory. A producer that
    cannot wait (``Turn.send_text_nowait``, for host callbacks) that finds the queue full
    cancels that exact run: a terminal ``RunNotice`` tells why, nothing is silently dropped.

Steering
    ``await lease.steer(message)`` (a text-only ``Prompt`` or a ``str``) adds a message to
    the running prompt turn: ``INJECTED`` once
    it is durably in the history; the backend takes it with ``turn.steering()``, or gets it
    as the prompt of a follow-up ``run_turn`` in the same run. ``IDLE`` (nothing admitted)
    when no prompt's run is active; ``start_run(message)`` then starts one.

Backends
    ``AgentBackend.run_turn(turn)`` gets a ``Turn``: ``prompt``, ``history`` (the visible
    history before this turn's user message, read once), ``offered_tools`` (``external_mcp``
    with its catalog while MCP servers are connected), ``tools`` (relay-bearing context),
    ``skills``, ``goal``; it reports through ``send_text``/``send_thought``,
    ``send_tool_row`` (diffs and locations bounded), ``ask_permission``, ``report_usage``,
    ``report_context``, ``send_plan`` (or ``send_markdown_plan``), ``set_commands``,
    ``set_title``, ``notice``, ``set_goal``; it takes the user's steering messages with
    ``steering()``. An optional ``available_commands()`` gives ``lease.commands``.

Permissions
    The host's ``PermissionPolicy`` classifies each tool request as allow or ask;
    ``external_mcp`` is always ask. An ask becomes a ``PermissionRequest`` with an opaque
    single-use ``responder``; answer ``responder.answer(PermissionAnswer.ALLOW_ONCE)`` or
    ``DENY_ONCE`` (or ``run.answer(id, ...)``). ``None`` (fail closed), an unknown id, a
    second answer, another run's id, an unknown option or an answer after cancel/revoke
    denies every pending request of the run and cancels it. Cancelling a run denies what is
    pending; the wait lives in the run's scope.

Models
    ``await service.model_choices(refresh=...)``: the host ``ModelCatalog`` read with one 30 s
    bound, account generation re-checked after, chat models only, host default first and still
    offered if a refresh fails. ``service.cached_model_choices()`` never waits (for creating
    sessions). ``lease.set_model(id)`` works until the first admitted message, then raises
    ``MODEL_LOCKED`` for any other model.

Modes
    Every session is in one mode of the host's ``ModeSet`` (``AgentService(modes=...)``; by
    default ``BUILTIN_MODES``: ``ask``, ``code`` (the default), ``plan``, ``auto-edit``).
    ``lease.modes``, ``lease.mode``; ``await lease.set_mode(id)`` stores it with the task
    (``UNKNOWN_MODE`` otherwise) and publishes ``ModeChanged``; a loaded task is in its stored
    mode (the default if the host no longer offers it). The runtime enforces the mode's
    ``ToolPolicy`` by ``ToolCategory``: ``turn.offered_tools`` and ``turn.tool_allowed`` show
    what the backend may offer; ``turn.ask_permission`` refuses a forbidden call without asking
    and allows unasked what the mode runs unasked (``auto-edit``: writes inside the session's
    directories), else the host's policy applies; ``ToolContext.run_shell``,
    ``call_external``, ``write_text`` and ``edit_text`` refuse a forbidden category
    (``ToolUnavailable``) even to a backend that never asked. A change applies from the next
    tool call.

Thinking effort
    A backend may declare ``thought_levels(model_id)``; ``lease.thought_levels``,
    ``lease.thought_level`` and ``await lease.set_thought_level(level)`` (stored with the task;
    ``UNKNOWN_THOUGHT_LEVEL`` otherwise; ``None`` restores the backend's default);
    ``turn.thought_level`` is read at each model request.

Boolean options
    A backend may declare ``boolean_options()`` (``BooleanOption``: id, name, description,
    default), asked once when the service is built; ``lease.boolean_options``,
    ``lease.option_values`` and ``await lease.set_boolean_option(id, value)`` (stored with the
    task; ``INVALID_OPTION`` otherwise); ``turn.boolean_option(id)`` is read at each decision.

Trust
    ``await lease.trust_status()`` before the first prompt: ``decision_needed`` when the
    project has a real, non-symlinked ``.agents/skills/**/SKILL.md`` and no saved decision.
    ``await lease.decide_trust(trusted)`` saves it (per account and canonical directory) and
    rebuilds ``lease.skills``; only a trusted project's skills reach the backend.

Goals
    ``lease.set_goal(objective)`` / ``pause_goal()`` / ``resume_goal()`` / ``clear_goal()``.
    While the goal is active and the task quiescent, the lease runs autonomous cycles through
    the backend. ``lease.session_events()`` is the stream outside any prompt: ``GoalChanged``
    (snapshot or ``None``), ``CycleStarted(run)`` (read its events like a prompt's),
    ``PromptStarted(run, text)`` (an observing window's prompt: read it the same way) and
    ``LeaseRevoked``.

Observers
    Other windows may follow a held task without holding it: ``lease.attach_observer()`` (or
    ``await service.observe_task(task_id, cwd)``, with a re-attach's root rule) gives an
    ``Observer``: its ``snapshot`` (the runs being read, as far as they were read, as
    ``TimelineItem`` rows), then ``async for item in observer``: ``PromptAdmitted``,
    ``RunBatch`` (a run's events as the holder's side read them), the session's
    ``GoalChanged``/``ModeChanged``/background events, and ``ObserverDetached`` last (the
    window detached, fell ``OBSERVER_BACKLOG`` events behind, or the lease went). Read through
    the lease, every ``PermissionRequest`` carries a ``PermissionTicket`` of its window on a
    ``SharedQuestion``: the first allow-once or deny-once decides, ``None`` withdraws that
    window only, and the last window's withdrawal denies. At most ``MAX_OBSERVERS``. An
    observing window prompts through the lease like the holder; the run it starts is handed to
    the holder with ``observer.hand_over(run, text)`` (the holder reads it from
    ``PromptStarted``), and ``await observer.shown(run.id)`` waits until its feed showed the end.
"""

from maple_acp.model import (
    CommandInfo,
    FileDiff,
    GoalRecord,
    GoalStatus,
    ImageRef,
    ItemKind,
    PlanEntry,
    PlanPriority,
    PlanStatus,
    SessionMode,
    TaskPage,
    TaskPolicy,
    TaskQuery,
    TaskRecord,
    TaskSurface,
    TimelineItem,
    ToolCategory,
    ToolLocation,
    ToolSpec,
    ToolState,
    ToolStatus,
    Usage,
)
from maple_acp.runtime._account_tasks import MAX_LIST_PAGE
from maple_acp.runtime._admission import (
    MAX_ADDITIONAL_DIRECTORIES,
    canonical_directory,
    within_roots,
)
from maple_acp.runtime._attachments import (
    IMAGE_TYPES,
    MAX_EMBEDDED_TEXT_BYTES,
    MAX_IMAGE_BYTES,
    MAX_PROMPT_IMAGES,
    EmbeddedText,
    Prompt,
    PromptCapabilities,
    PromptImage,
    check_embedded_text,
    check_image,
    check_image_count,
    describe_image,
    sniff_image,
)
from maple_acp.runtime._backend import (
    AgentBackend,
    Backend,
    CommandSource,
    GoalProgress,
    PromptContentSource,
    ThoughtLevelSource,
    TurnFailed,
    TurnResult,
    declared_backend,
    warm_up_quietly,
)
from maple_acp.runtime._background import MAX_BACKGROUND_COMMANDS, BackgroundInfo
from maple_acp.runtime._barrier import PromptClaim
from maple_acp.runtime._children import (
    MAX_ANSWER_CHARS,
    MAX_RUNNING_CHILDREN,
    MAX_SESSION_CHILDREN,
)
from maple_acp.runtime._errors import (
    CHILD_SESSION_MESSAGE,
    MAX_MESSAGE_CHARS,
    RejectionKind,
    RuntimeRejection,
    bounded_text,
)
from maple_acp.runtime._events import (
    ChildAnnounced,
    ChildEnded,
    ChildEvent,
    ChildReport,
    ChildRunning,
    CommandsChanged,
    CompactionChanged,
    CompactionText,
    ContextUsage,
    PermissionRequest,
    PlanUpdated,
    RunEnded,
    RunEvent,
    RunKind,
    RunNotice,
    RunOutcome,
    RunState,
    StopReason,
    TextChunk,
    ThoughtChunk,
    TitleChanged,
    ToolOutput,
    ToolRow,
    UsageUpdate,
)
from maple_acp.runtime._files import (
    MAX_DIFF_CHARS,
    MAX_READ_CHARS,
    FileChange,
    FileRead,
    FileToolError,
    edit_text_async,
    read_text_async,
    resolve_in_root,
    write_text_async,
)
from maple_acp.runtime._goals import MAX_GOAL_ITERATIONS, MAX_GOAL_OBJECTIVE_CHARS
from maple_acp.runtime._lease import SessionLease
from maple_acp.runtime._lease_life import LEASE_CLEANUP_BOUND_S, RouterFactory
from maple_acp.runtime._live_output import (
    LIVE_TAIL_CHARS,
    ShellOutput,
    exit_line,
    shell_row_text,
)
from maple_acp.runtime._models import (
    MODEL_CACHE_TTL_S,
    MODEL_DISCOVERY_BOUND_S,
    ModelCatalog,
    ModelChoices,
    ModelInfo,
    StaticModelCatalog,
)
from maple_acp.runtime._modes import (
    ASK_MODE,
    AUTO_EDIT_MODE,
    BUILTIN_MODES,
    BUILTIN_TOOL_CATEGORIES,
    CODE_MODE,
    PLAN_MODE,
    ModeDeclaration,
    ModeSet,
    ToolPolicy,
)
from maple_acp.runtime._observers import (
    MAX_OBSERVERS,
    OBSERVER_BACKLOG,
    ObservedEvent,
    Observer,
    ObserverDetached,
    PromptAdmitted,
    RunBatch,
    RunSnapshot,
)
from maple_acp.runtime._offer import (
    MAX_COMMANDS,
    MAX_PLAN_ENTRIES,
    MAX_PLAN_MARKDOWN_CHARS,
    external_mcp_spec,
)
from maple_acp.runtime._options import MAX_BOOLEAN_OPTIONS, BooleanOption
from maple_acp.runtime._permissions import (
    EXTERNAL_MCP_TOOL,
    AskForTools,
    PermissionAnswer,
    PermissionClass,
    PermissionPolicy,
    PermissionResponder,
    PermissionTicket,
    SharedQuestion,
    ToolRequest,
)
from maple_acp.runtime._prompt_queue import MAX_PREVIEW_CHARS, MAX_QUEUED_PROMPTS, Withdrawn
from maple_acp.runtime._relay import (
    MAX_RELAY_TOTAL_BYTES,
    MAX_RELAY_VALUE_BYTES,
    MAX_RELAY_VALUES,
    RelayValues,
    validate_relay_values,
)
from maple_acp.runtime._replies import HeldTask, HeldTaskState, ServiceStatus, TaskListing
from maple_acp.runtime._run import RUN_EVENT_QUEUE, Run
from maple_acp.runtime._service import (
    DEFAULT_PROVISIONAL_GRACE_S,
    DRAIN_BOUND_S,
    AgentService,
)
from maple_acp.runtime._session_events import (
    SESSION_EVENT_QUEUE,
    BackgroundEnded,
    BackgroundOutput,
    CycleStarted,
    GoalChanged,
    LeaseRevoked,
    ModeChanged,
    PromptStarted,
    QueueChanged,
    QueuedPrompt,
    SessionEvent,
    SessionEvents,
)
from maple_acp.runtime._steering import MAX_WAITING_STEERS, SteeringOutcome
from maple_acp.runtime._sweep import PROVISIONAL_SWEEP_INTERVAL_S
from maple_acp.runtime._threads import hold_virtual_time, in_worker_thread
from maple_acp.runtime._tools import (
    ExternalToolDefinition,
    ExternalToolRouter,
    ShellResult,
    ToolContext,
    ToolUnavailable,
)
from maple_acp.runtime._trust import SkillInfo, TrustStatus, find_project_skills
from maple_acp.runtime._turn import DelegationResult, Turn

__all__ = [
    "ASK_MODE",
    "AUTO_EDIT_MODE",
    "BUILTIN_MODES",
    "BUILTIN_TOOL_CATEGORIES",
    "CHILD_SESSION_MESSAGE",
    "CODE_MODE",
    "DEFAULT_PROVISIONAL_GRACE_S",
    "DRAIN_BOUND_S",
    "EXTERNAL_MCP_TOOL",
    "IMAGE_TYPES",
    "LEASE_CLEANUP_BOUND_S",
    "LIVE_TAIL_CHARS",
    "MAX_ADDITIONAL_DIRECTORIES",
    "MAX_ANSWER_CHARS",
    "MAX_BACKGROUND_COMMANDS",
    "MAX_BOOLEAN_OPTIONS",
    "MAX_COMMANDS",
    "MAX_DIFF_CHARS",
    "MAX_EMBEDDED_TEXT_BYTES",
    "MAX_GOAL_ITERATIONS",
    "MAX_GOAL_OBJECTIVE_CHARS",
    "MAX_IMAGE_BYTES",
    "MAX_LIST_PAGE",
    "MAX_MESSAGE_CHARS",
    "MAX_OBSERVERS",
    "MAX_PLAN_ENTRIES",
    "MAX_PLAN_MARKDOWN_CHARS",
    "MAX_PREVIEW_CHARS",
    "MAX_PROMPT_IMAGES",
    "MAX_QUEUED_PROMPTS",
    "MAX_READ_CHARS",
    "MAX_RELAY_TOTAL_BYTES",
    "MAX_RELAY_VALUES",
    "MAX_RELAY_VALUE_BYTES",
    "MAX_RUNNING_CHILDREN",
    "MAX_SESSION_CHILDREN",
    "MAX_WAITING_STEERS",
    "MODEL_CACHE_TTL_S",
    "MODEL_DISCOVERY_BOUND_S",
    "OBSERVER_BACKLOG",
    "PLAN_MODE",
    "PROVISIONAL_SWEEP_INTERVAL_S",
    "RUN_EVENT_QUEUE",
    "SESSION_EVENT_QUEUE",
    "AgentBackend",
    "AgentService",
    "AskForTools",
    "Backend",
    "BackgroundEnded",
    "BackgroundInfo",
    "BackgroundOutput",
    "BooleanOption",
    "ChildAnnounced",
    "ChildEnded",
    "ChildEvent",
    "ChildReport",
    "ChildRunning",
    "CommandInfo",
    "CommandSource",
    "CommandsChanged",
    "CompactionChanged",
    "CompactionText",
    "ContextUsage",
    "CycleStarted",
    "DelegationResult",
    "EmbeddedText",
    "ExternalToolDefinition",
    "ExternalToolRouter",
    "FileChange",
    "FileDiff",
    "FileRead",
    "FileToolError",
    "GoalChanged",
    "GoalProgress",
    "GoalRecord",
    "GoalStatus",
    "HeldTask",
    "HeldTaskState",
    "ImageRef",
    "ItemKind",
    "LeaseRevoked",
    "ModeChanged",
    "ModeDeclaration",
    "ModeSet",
    "ModelCatalog",
    "ModelChoices",
    "ModelInfo",
    "ObservedEvent",
    "Observer",
    "ObserverDetached",
    "PermissionAnswer",
    "PermissionClass",
    "PermissionPolicy",
    "PermissionRequest",
    "PermissionResponder",
    "PermissionTicket",
    "PlanEntry",
    "PlanPriority",
    "PlanStatus",
    "PlanUpdated",
    "Prompt",
    "PromptAdmitted",
    "PromptCapabilities",
    "PromptClaim",
    "PromptContentSource",
    "PromptImage",
    "PromptStarted",
    "QueueChanged",
    "QueuedPrompt",
    "RejectionKind",
    "RelayValues",
    "RouterFactory",
    "Run",
    "RunBatch",
    "RunEnded",
    "RunEvent",
    "RunKind",
    "RunNotice",
    "RunOutcome",
    "RunSnapshot",
    "RunState",
    "RuntimeRejection",
    "ServiceStatus",
    "SessionEvent",
    "SessionEvents",
    "SessionLease",
    "SessionMode",
    "SharedQuestion",
    "ShellOutput",
    "ShellResult",
    "SkillInfo",
    "StaticModelCatalog",
    "SteeringOutcome",
    "StopReason",
    "TaskListing",
    "TaskPage",
    "TaskPolicy",
    "TaskQuery",
    "TaskRecord",
    "TaskSurface",
    "TextChunk",
    "ThoughtChunk",
    "ThoughtLevelSource",
    "TimelineItem",
    "TitleChanged",
    "ToolCategory",
    "ToolContext",
    "ToolLocation",
    "ToolOutput",
    "ToolPolicy",
    "ToolRequest",
    "ToolRow",
    "ToolSpec",
    "ToolState",
    "ToolStatus",
    "ToolUnavailable",
    "TrustStatus",
    "Turn",
    "TurnFailed",
    "TurnResult",
    "Usage",
    "UsageUpdate",
    "Withdrawn",
    "bounded_text",
    "canonical_directory",
    "check_embedded_text",
    "check_image",
    "check_image_count",
    "declared_backend",
    "describe_image",
    "edit_text_async",
    "exit_line",
    "external_mcp_spec",
    "find_project_skills",
    "hold_virtual_time",
    "in_worker_thread",
    "read_text_async",
    "resolve_in_root",
    "shell_row_text",
    "sniff_image",
    "validate_relay_values",
    "warm_up_quietly",
    "within_roots",
    "write_text_async",
]
