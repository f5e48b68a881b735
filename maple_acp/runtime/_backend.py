"""The backend protocol: the host's agent engine, driven one turn at a time.

:class:`AgentBackend` is the least a backend writes (``run_turn``); :class:`Backend` is the
whole protocol, every optional member (commands, thinking levels, boolean options, prompt
content, images, warm-up, close, ``async with``) declared with its default. An engine
subclasses ``Backend`` and overrides what it has; the runtime and the host call those members
directly.

A backend written before ``Backend`` existed declared its optional members by their
structure (the small protocols below); :func:`declared_backend` gives it the same whole
protocol, asking each of those protocols once (``isinstance``) when it makes the view.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

import attrs

from maple_acp._exceptions import MapleAcpError
from maple_acp.model import CommandInfo, GoalStatus
from maple_acp.runtime._attachments import PromptCapabilities
from maple_acp.runtime._events import StopReason
from maple_acp.runtime._options import BooleanOption, checked_boolean_options

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
    """The least a host's agent engine writes.

    ``run_turn`` is called once per run, inside the run's cancel scope: for a prompt (whose user
    message is already durably admitted) or for an autonomous goal cycle (``turn.kind``). It
    reports everything through ``turn`` and returns how the turn ended (a ``TurnResult``, or
    ``None`` for a finished answer). Raising
    ``TurnFailed`` fails the run with that text; any other exception fails it with a generic
    text. Cancellation (``session/cancel``, revocation, a prompt preempting a goal cycle) arrives
    as ``trio.Cancelled`` at the backend's next checkpoint.

    Everything else a backend may offer is declared, with its default, by :class:`Backend`.
    """

    async def run_turn(self, turn: Turn) -> TurnResult | None: ...


class Backend:
    """The whole backend protocol, each optional member with its default: subclass it, write
    :meth:`run_turn`, and override what the engine has.

    Resource handling: a host enters the backend (``async with backend:``) around the runtime
    that uses it, starts :meth:`warm_up` in the background once it serves, and the exit calls
    :meth:`aclose`. The defaults hold nothing and do nothing."""

    async def run_turn(self, turn: Turn) -> TurnResult | None:
        """One run's turn (see :class:`AgentBackend`)."""
        raise NotImplementedError

    def available_commands(self) -> Sequence[CommandInfo]:
        """The commands a client offers as slash commands; asked when a session opens (an
        exception counts as none). ``Turn.set_commands`` changes them later. None by
        default."""
        return ()

    def thought_levels(self, model_id: str | None) -> Sequence[str]:
        """The thinking levels ``model_id`` (the task's model, ``None`` when it has none)
        offers, in the order a client shows them; none by default."""
        return ()

    def boolean_options(self) -> Sequence[BooleanOption]:
        """The on/off options every session offers (a client shows each as a toggle; a turn
        reads its session's value with ``Turn.boolean_option``); asked once, when the host
        starts. None by default."""
        return ()

    @property
    def prompt_capabilities(self) -> PromptCapabilities:
        """What a prompt may carry besides text and resource links: text only by default
        (images and embedded resources are refused before they reach the backend). A class
        attribute holding a ``PromptCapabilities`` overrides it as well."""
        return PromptCapabilities()

    def accepts_images(self, model_id: str | None) -> bool:
        """Whether ``model_id`` (``None``: the default model) sees images; by default, what
        :attr:`prompt_capabilities` says."""
        return self.prompt_capabilities.image

    async def warm_up(self) -> None:
        """Work ahead of the first turn (import an SDK, open clients), started in the
        background once the host serves. Must not raise: a turn meets the same failure and
        says it. Nothing by default."""

    async def aclose(self) -> None:
        """Release what the backend holds (its connections). Nothing by default."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@runtime_checkable
class CommandSource(Protocol):
    """What a backend written before :class:`Backend` defined to offer commands."""

    def available_commands(self) -> Sequence[CommandInfo]: ...


@runtime_checkable
class ThoughtLevelSource(Protocol):
    """What a backend written before :class:`Backend` defined when its models take a
    thinking effort."""

    def thought_levels(self, model_id: str | None) -> Sequence[str]: ...


class PromptContentSource(Protocol):
    """What a backend written before :class:`Backend` defined to take more than text (both
    members were optional: see :class:`_DeclaresContent` and :class:`_JudgesImages`)."""

    @property
    def prompt_capabilities(self) -> PromptCapabilities: ...

    def accepts_images(self, model_id: str | None) -> bool: ...


@runtime_checkable
class _DeclaresContent(Protocol):
    @property
    def prompt_capabilities(self) -> PromptCapabilities: ...


@runtime_checkable
class _JudgesImages(Protocol):
    def accepts_images(self, model_id: str | None) -> bool: ...


@runtime_checkable
class _DeclaresBooleanOptions(Protocol):
    def boolean_options(self) -> Sequence[BooleanOption]: ...


@runtime_checkable
class _WarmsUp(Protocol):
    async def warm_up(self) -> None: ...


@runtime_checkable
class _Closes(Protocol):
    async def aclose(self) -> None: ...


class _StructuralBackend(Backend):
    """A backend that does not subclass :class:`Backend`, seen through the whole protocol: a
    member it defines (by the old structural protocols, asked once, when the view is made) is
    its own, any other the default."""

    def __init__(self, backend: AgentBackend) -> None:
        self._backend = backend
        self._commands = backend if isinstance(backend, CommandSource) else None
        self._levels = backend if isinstance(backend, ThoughtLevelSource) else None
        self._options = backend if isinstance(backend, _DeclaresBooleanOptions) else None
        self._content = backend if isinstance(backend, _DeclaresContent) else None
        self._images = backend if isinstance(backend, _JudgesImages) else None
        self._warms = backend if isinstance(backend, _WarmsUp) else None
        self._closes = backend if isinstance(backend, _Closes) else None
        self._context = backend if isinstance(backend, AbstractAsyncContextManager) else None

    async def run_turn(self, turn: Turn) -> TurnResult | None:
        return await self._backend.run_turn(turn)

    def available_commands(self) -> Sequence[CommandInfo]:
        return () if self._commands is None else self._commands.available_commands()

    def thought_levels(self, model_id: str | None) -> Sequence[str]:
        return () if self._levels is None else self._levels.thought_levels(model_id)

    def boolean_options(self) -> Sequence[BooleanOption]:
        return () if self._options is None else self._options.boolean_options()

    @property
    def prompt_capabilities(self) -> PromptCapabilities:
        if self._content is None:
            return PromptCapabilities()
        return self._content.prompt_capabilities

    def accepts_images(self, model_id: str | None) -> bool:
        if self._images is None:
            return super().accepts_images(model_id)
        return self._images.accepts_images(model_id)

    async def warm_up(self) -> None:
        if self._warms is not None:
            await self._warms.warm_up()

    async def aclose(self) -> None:
        if self._closes is not None:
            await self._closes.aclose()

    async def __aenter__(self) -> Self:
        if self._context is not None:
            await self._context.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._context is not None:
            await self._context.__aexit__(*exc_info)  # type: ignore[arg-type]
        else:
            await self.aclose()


def declared_backend(backend: AgentBackend) -> Backend:
    """``backend`` with every member of the protocol: itself when it subclasses
    :class:`Backend`, else a view of it giving the default of each member it does not
    define."""
    return backend if isinstance(backend, Backend) else _StructuralBackend(backend)


async def warm_up_quietly(backend: Backend) -> None:
    """``backend.warm_up()``, its failure logged instead of raised: a host starts it in its
    own nursery, which an engine's failure to prepare must not bring down (its first turn
    meets the same failure and says it)."""
    try:
        await backend.warm_up()
    except Exception as exc:
        logger.warning("the agent backend could not warm up (%s)", type(exc).__name__)


def backend_commands(backend: AgentBackend) -> Sequence[CommandInfo]:
    """The backend's commands, or none if it declares none (or fails to list them)."""
    try:
        return declared_backend(backend).available_commands()
    except Exception:
        logger.warning("the agent backend failed to list its commands", exc_info=True)
        return ()


#: Thinking-effort levels one model may declare: a client shows them in one menu.
MAX_THOUGHT_LEVELS = 16
#: One level's id, at most.
MAX_THOUGHT_LEVEL_CHARS = 64


def backend_thought_levels(backend: AgentBackend, model_id: str | None) -> tuple[str, ...]:
    """The levels the backend declares for ``model_id``: none if it declares none (or fails
    to list them, or lists something that is not a short plain string)."""
    try:
        levels = tuple(declared_backend(backend).thought_levels(model_id))
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


def backend_boolean_options(backend: AgentBackend) -> tuple[BooleanOption, ...]:
    """The boolean options the backend declares: none if it declares none (or fails to list
    them, or lists one that breaks a bound)."""
    try:
        declared = tuple(declared_backend(backend).boolean_options())
    except Exception:
        logger.warning("the agent backend failed to list its boolean options", exc_info=True)
        return ()
    return checked_boolean_options(declared)


def backend_prompt_capabilities(backend: AgentBackend) -> PromptCapabilities:
    """What the backend declares it takes in a prompt; nothing beyond text if it declares
    nothing (or something that is not a ``PromptCapabilities``)."""
    declared: object = declared_backend(backend).prompt_capabilities
    if not isinstance(declared, PromptCapabilities):
        logger.warning("the agent backend's prompt_capabilities is malformed; text only")
        return PromptCapabilities()
    return declared


def backend_accepts_images(backend: AgentBackend, model_id: str | None) -> bool:
    """Whether the backend takes images for ``model_id`` (False if it fails to say)."""
    if not backend_prompt_capabilities(backend).image:
        return False
    try:
        return bool(declared_backend(backend).accepts_images(model_id))
    except Exception:
        logger.warning("the agent backend failed to say whether a model sees images", exc_info=True)
        return False
