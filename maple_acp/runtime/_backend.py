"""The ``AgentBackend`` protocol: the host's agent engine, driven one turn at a time."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from maple_acp._exceptions import MapleAcpError
from maple_acp.model import CommandInfo, GoalStatus
from maple_acp.runtime._attachments import PromptCapabilities
from maple_acp.runtime._events import StopReason

if TYPE_CHECKING:
    from maple_acp.runtime._turn import Turn

logger = logging.getLogger(__name__)


class TurnFailed(MapleAcpError):
    """Raised by a backend to end its turn as failed. ``str(exc)`` becomes the run's failure
    text (bounded to one line of 500 characters), so it must be safe to show.

    ``loggable=True`` says the text quotes nothing a user, a file or a tool wrote (a provider's
    status line, say), so the host's log may give it as the reason; otherwise the log says
    only that the backend failed the turn."""

    def __init__(self, message: str, *, loggable: bool = False) -> None:
        super().__init__(message)
        self.loggable = loggable


@attrs.frozen(kw_only=True)
class GoalProgress:
    """What one autonomous goal cycle concluded. ``ACTIVE`` asks for another cycle."""

    status: GoalStatus = GoalStatus.ACTIVE
    reason: str = ""


@attrs.frozen(kw_only=True)
class TurnResult:
    """How a turn ended, as ``run_turn`` returns it. Returning ``None`` means ``TurnResult()``:
    the model finished its answer."""

    #: Why the turn stopped: ``END_TURN``, or ``MAX_TOKENS``, ``MAX_TURN_REQUESTS``, ``REFUSAL``
    #: when it returned normally for another reason than a finished answer.
    stop_reason: StopReason = StopReason.END_TURN
    #: For a goal cycle: how the goal stands after it (``None``: no conclusion, another cycle).
    goal_progress: GoalProgress | None = None


class AgentBackend(Protocol):
    """The host's agent engine.

    ``run_turn`` is called once per run, inside the run's cancel scope: for a prompt (whose user
    message is already durably admitted) or for an autonomous goal cycle (``turn.kind``). It
    reports everything through ``turn`` and returns how the turn ended (a ``TurnResult``, or
    ``None`` for a finished answer). Raising
    ``TurnFailed`` fails the run with that text; any other exception fails it with a generic
    text. Cancellation (``session/cancel``, revocation, a prompt preempting a goal cycle) arrives
    as ``trio.Cancelled`` at the backend's next checkpoint.
    """

    async def run_turn(self, turn: Turn) -> TurnResult | None: ...


class CommandSource(Protocol):
    """What a backend that offers commands also defines (optional: a backend without
    ``available_commands`` offers none). Called when a lease is made; ``Turn.set_commands``
    changes them later."""

    def available_commands(self) -> Sequence[CommandInfo]: ...


def backend_commands(backend: AgentBackend) -> Sequence[CommandInfo]:
    """The backend's commands, or none if it declares none (or fails to list them)."""
    available = getattr(backend, "available_commands", None)
    if available is None:
        return ()
    try:
        commands: Sequence[CommandInfo] = available()
    except Exception:
        logger.warning("the agent backend failed to list its commands", exc_info=True)
        return ()
    return commands


class ThoughtLevelSource(Protocol):
    """What a backend whose models take a thinking effort also defines (optional: a backend
    without ``thought_levels`` offers none). ``model_id`` is the task's model (``None`` when it
    has none); the answer is the levels a caller may choose, in the order it shows them, or
    none for a model without levels."""

    def thought_levels(self, model_id: str | None) -> Sequence[str]: ...


#: Thinking-effort levels one model may declare: a client shows them in one menu.
MAX_THOUGHT_LEVELS = 16
#: One level's id, at most.
MAX_THOUGHT_LEVEL_CHARS = 64


def backend_thought_levels(backend: AgentBackend, model_id: str | None) -> tuple[str, ...]:
    """The levels the backend declares for ``model_id``: none if it declares none (or fails
    to list them, or lists something that is not a short plain string)."""
    declared = getattr(backend, "thought_levels", None)
    if declared is None:
        return ()
    try:
        levels = tuple(declared(model_id))
    except Exception:
        logger.warning("the agent backend failed to list its thought levels", exc_info=True)
        return ()
    if len(levels) > MAX_THOUGHT_LEVELS or not all(
        isinstance(level, str)
        and 0 < len(level) <= MAX_THOUGHT_LEVEL_CHARS
        and level.isprintable()
        and level == level.strip()
        for level in levels
    ):
        logger.warning("the agent backend listed malformed thought levels; none are offered")
        return ()
    return tuple(dict.fromkeys(levels))


class PromptContentSource(Protocol):
    """What a backend that takes more than text declares (optional: a backend without
    ``prompt_capabilities`` takes text and resource links only, and images and embedded
    resources are refused before they reach it). ``accepts_images`` (also optional; default:
    ``prompt_capabilities.image``) says whether one model sees images (``model_id`` ``None``:
    the backend's default model)."""

    @property
    def prompt_capabilities(self) -> PromptCapabilities: ...

    def accepts_images(self, model_id: str | None) -> bool: ...


def backend_prompt_capabilities(backend: AgentBackend) -> PromptCapabilities:
    """What the backend declares it takes in a prompt; nothing beyond text if it declares
    nothing (or something that is not a ``PromptCapabilities``)."""
    declared = getattr(backend, "prompt_capabilities", None)
    if declared is None:
        return PromptCapabilities()
    if not isinstance(declared, PromptCapabilities):
        logger.warning("the agent backend's prompt_capabilities is malformed; text only")
        return PromptCapabilities()
    return declared


def backend_accepts_images(backend: AgentBackend, model_id: str | None) -> bool:
    """Whether the backend takes images for ``model_id`` (False if it fails to say)."""
    if not backend_prompt_capabilities(backend).image:
        return False
    accepts = getattr(backend, "accepts_images", None)
    if accepts is None:
        return True
    try:
        return bool(accepts(model_id))
    except Exception:
        logger.warning("the agent backend failed to say whether a model sees images", exc_info=True)
        return False
