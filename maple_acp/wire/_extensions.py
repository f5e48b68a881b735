"""Protocol-level cancellation and the extensions outside ACP's core: goals, steering, background
commands, the prompt queue and the bridge hello."""

from typing import Any, Final, Literal

import attrs

from ._content import ContentBlock, Meta
from ._validators import non_negative

#: The method through which a client controls a session's goal.
GOAL_CONTROL_METHOD: Final = "_session/goal"
#: The host's status request (``maple-acp status``; same trust boundary as every other method).
STATUS_METHOD: Final = "_maple/status"
#: A session's history replayed to a viewer (``maple-acp sessions show``): it takes no lease
#: and needs no model, so it shows any stored session the caller may list.
TRANSCRIPT_METHOD: Final = "_maple/transcript"
#: The notification a connector may send first, carrying allow-listed relay values.
BRIDGE_HELLO_METHOD: Final = "_maple/bridge/hello"
#: The goal extension's version advertised in ``initialize``.
GOAL_EXTENSION_VERSION: Final = 1

#: The method through which a client adds a message to a running turn (the steering extension
#: the leading ACP adapters share).
STEERING_METHOD: Final = "_session/steering"

#: The method through which a client lists and stops a session's background commands.
BACKGROUND_METHOD: Final = "_session/background"

#: The method through which a client lists a session's waiting prompts and withdraws them.
QUEUE_METHOD: Final = "_session/queue"
#: The notification that tells a client a session's waiting prompts after every change.
QUEUE_CHANGED_METHOD: Final = "_session/queue_changed"
#: The ``_meta`` key of the initialize answer that advertises the prompt queue.
PROMPT_QUEUE_META_KEY: Final = "maple.promptQueue"

GoalAction = Literal["set", "pause", "resume", "clear"]
QueueAction = Literal["list", "remove", "clear"]
BackgroundAction = Literal["list", "stop"]
BackgroundStatus = Literal["running", "exited"]
SteeringOutcome = Literal["injected", "startedNewTurn", "promptRequired"]
GoalStatus = Literal["active", "paused", "blocked", "limited", "complete"]


@attrs.frozen(kw_only=True)
class CancelRequestNotification:
    """Params of ``$/cancel_request``; ``requestId`` may be a number, a string or null."""

    request_id: int | str | None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class GoalCapability:
    """``_meta.goal`` of the initialize response: which control actions truly work."""

    version: int = GOAL_EXTENSION_VERSION
    control_method: str = GOAL_CONTROL_METHOD
    actions: tuple[GoalAction, ...] = ()


@attrs.frozen(kw_only=True)
class GoalSnapshot:
    """``session_info_update._meta.goal``; timestamps are Unix milliseconds."""

    objective: str
    status: GoalStatus
    iterations: int | None = attrs.field(default=None, validator=non_negative)
    last_reason: str | None = None
    created_at: int | None = attrs.field(default=None, validator=non_negative)
    updated_at: int | None = attrs.field(default=None, validator=non_negative)
    #: Budget and usage figures the runtime knows, in whatever shape it reports them.
    budgets: dict[str, Any] | None = None
    control_method: str | None = None


@attrs.frozen(kw_only=True)
class GoalControlRequest:
    """Params of ``_session/goal``; ``objective`` goes with ``set``."""

    session_id: str
    action: GoalAction
    objective: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class GoalControlResponse:
    """The result of ``_session/goal``: an empty object."""

    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SteeringRequest:
    """Params of ``_session/steering``: the message, as a prompt's blocks. ``_meta.steering``
    may carry ``idleBehavior: "promptRequired"`` (with no turn running, start none)."""

    session_id: str
    prompt: tuple[ContentBlock, ...]
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class SteeringResponse:
    """The result of ``_session/steering``."""

    outcome: SteeringOutcome
    reason: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class BridgeHello:
    """Params of ``_maple/bridge/hello``: relay values offered by the connector."""

    environment: dict[str, str] = attrs.field(factory=dict)
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class StatusRequest:
    """Params of ``_maple/status``: none."""

    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class TranscriptRequest:
    """Params of ``_maple/transcript``: the session whose history is replayed, as
    ``session/update`` notifications sent before the (empty) answer."""

    session_id: str
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class TranscriptResponse:
    """The result of ``_maple/transcript``: nothing (the history came before it)."""

    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class HostStatus:
    """The result of ``_maple/status``: what a host runs right now (``endpoint`` is absent
    when the service is not listening on a socket)."""

    running: bool
    endpoint: str | None = None
    connections: int = attrs.field(validator=non_negative)
    sessions: int = attrs.field(validator=non_negative)
    active_runs: int = attrs.field(validator=non_negative)
    leases: int = attrs.field(validator=non_negative)
    signed_in: bool
    #: What the host runs its turns with, as the host describes it (``maple-acp serve``:
    #: ``backend``, ``defaultModel`` and each provider's start-up check); absent when the
    #: host says nothing.
    engine: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class BackgroundRequest:
    """Params of ``_session/background``: ``list``, or ``stop`` the command ``handle``."""

    session_id: str
    action: BackgroundAction
    handle: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class BackgroundCommand:
    """One background command in a ``_session/background`` listing."""

    handle: str
    command: str
    status: BackgroundStatus
    exit_code: int | None = None


@attrs.frozen(kw_only=True)
class BackgroundResponse:
    """The result of ``_session/background``: the commands for ``list``, nothing for
    ``stop``."""

    commands: tuple[BackgroundCommand, ...] | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class QueueRequest:
    """Params of ``_session/queue``: ``list`` the waiting prompts, ``remove`` the one
    ``entryId`` names, or ``clear`` them all."""

    session_id: str
    action: QueueAction
    entry_id: str | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class QueueEntry:
    """One waiting prompt: its id, the start of its text, and when it was queued (RFC 3339)."""

    entry_id: str
    preview: str
    queued_at: str


@attrs.frozen(kw_only=True)
class QueueResponse:
    """The result of ``_session/queue``: the entries for ``list``, nothing otherwise."""

    entries: tuple[QueueEntry, ...] | None = None
    meta: Meta | None = None


@attrs.frozen(kw_only=True)
class QueueChangedNotification:
    """Params of ``_session/queue_changed``: the session's waiting prompts as they are now."""

    session_id: str
    entries: tuple[QueueEntry, ...]
