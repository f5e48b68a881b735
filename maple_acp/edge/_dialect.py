"""What differs between protocol versions, as one object per version chosen at ``initialize``.

A :class:`Dialect` holds the method table (method -> params type and the version-neutral
operation that serves it), the projection of runtime events and stored history into updates
(one :class:`Projection` per session) and the answer shapes (session open answers, the prompt
answer, modes and config options, the permission question). The flows (``_opening``,
``_closing``, ``_turn``, ``_trust``, ``_goals``) call these and never build a
version-specific shape themselves, so a second version is a second dialect, not version checks
in the flows. ``_v1`` and ``_v2`` are the two there are.

Nothing here does I/O: resource handling, errors and cancellation are the flows'. A dialect
refuses bad input with ``ProtocolError(-32602)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol

import attrs

from maple_acp.edge._projection import ImageSlot, Outbound, SessionSettings
from maple_acp.model import CommandInfo, GoalRecord, ImageRef, MessageRow, TimelineItem
from maple_acp.runtime import ModelChoices, RunEvent, RunState, StopReason, ToolRequest, Usage
from maple_acp.wire import InitializeResponse

__all__ = [
    "FAIL_CLOSED",
    "ConfigChange",
    "Dialect",
    "ImageSlot",
    "NoTurnFrames",
    "Outbound",
    "Projection",
    "Route",
    "SessionSettings",
]

#: An answer no runtime responder accepts: handing it over fails the request closed (deny, and
#: cancel the run), which is the rule for every malformed or failed permission answer.
FAIL_CLOSED: Final = "fail-closed"


@attrs.frozen
class Route:
    """One inbound method: its params type, the operation that serves it (a name the
    connection resolves to a flow's handler), and whether the params carry a session id."""

    params: Any
    operation: str
    has_session_id: bool = False


@attrs.frozen
class ConfigChange:
    """A well-formed config change a client asked for: which of the session's settings, and
    its new value (``None``: the backend's default thinking effort). The runtime judges the
    value."""

    setting: Literal["model", "mode", "thought_level"]
    value: str | None


class Projection(Protocol):
    """Builds every update of one session (and keeps what that needs, e.g. announced tools).

    ``text_line`` is the streaming hot path: the one finished line of a text chunk, or
    ``None`` when :meth:`text` must build it."""

    def text_line(self, kind: Any, message_id: str, text: str) -> bytes | None: ...

    def text(self, kind: Any, message_id: str, text: str) -> list[bytes]: ...

    def notice(self, message_id: str, text: str) -> list[bytes]: ...

    def event(self, event: RunEvent) -> Outbound | list[bytes] | None:
        """The update(s) of a run event other than text, a permission request and the end."""
        ...

    def title(self, title: str) -> Outbound: ...

    def goal(self, goal: GoalRecord | None) -> Outbound: ...

    def commands(self, commands: Sequence[CommandInfo]) -> Outbound: ...

    def config_update(self, options: Any) -> Outbound: ...

    def mode_change(self, mode_id: str, options: Any) -> list[Outbound]:
        """What a change of the session's mode announces (its config options with it)."""
        ...

    def history(
        self, rows: Sequence[TimelineItem | MessageRow]
    ) -> Iterable[Outbound | ImageSlot]: ...

    def image(self, message_id: str, image: ImageRef, data: bytes) -> Outbound:
        """A user message's image, as a replay shows it."""
        ...

    def image_placeholder(self, message_id: str, image: ImageRef, why: str) -> list[bytes]:
        """The text a replay shows for an image it cannot send."""
        ...

    def permission_request(self, request: ToolRequest) -> Any:
        """The client method's request that asks about ``request`` (the channel sends it)."""
        ...

    def question(self, question_id: str, title: str, options: Sequence[Any]) -> Any:
        """A permission request that is a question of the agent's own (no tool call)."""
        ...

    # The turn's frame. Each returns the updates to send (none in a version without them).

    def accepted(self, message_id: str, text: str) -> list[Outbound]:
        """A prompt's user message was inserted as ``message_id``."""
        ...

    def run_started(self) -> list[Outbound]: ...

    def run_ended(self, state: RunState, reason: StopReason) -> list[Outbound]:
        """The last updates of a run, after every other one."""
        ...

    def permission_waiting(self) -> list[Outbound]: ...

    def permission_settled(self) -> list[Outbound]: ...

    def attached(self, running: bool) -> list[Outbound]:
        """The current state, sent by a resume before its answer."""
        ...

    def turn_ended(
        self, state: RunState, usage: Usage | None, reason: StopReason
    ) -> list[Outbound]:
        """The end of a turn a steering message started, after its ``run_ended`` frames: in a
        version whose prompt answer ends a turn, what that answer would have carried."""
        ...


class NoTurnFrames:
    """For a version whose turn is framed by its answer alone: no frame updates."""

    def accepted(self, message_id: str, text: str) -> list[Outbound]:
        return []

    def run_started(self) -> list[Outbound]:
        return []

    def run_ended(self, state: RunState, reason: StopReason) -> list[Outbound]:
        return []

    def permission_waiting(self) -> list[Outbound]:
        return []

    def permission_settled(self) -> list[Outbound]:
        return []

    def attached(self, running: bool) -> list[Outbound]:
        return []


class Dialect(Protocol):
    """One protocol version. See the module docstring."""

    @property
    def version(self) -> int: ...

    @property
    def routes(self) -> Mapping[str, Route]: ...

    @property
    def answers_on_acceptance(self) -> bool:
        """A prompt is answered once its message is inserted (:meth:`acceptance_answer`);
        the turn goes on and ends in updates. Otherwise the answer ends the turn."""
        ...

    @property
    def accepts_batches(self) -> bool:
        """A top-level array on the stream is a JSON-RPC batch (else it is refused)."""
        ...

    @property
    def chunk_kinds(self) -> Mapping[type, Any]:
        """The update kind of each text event type (``TextChunk``, ``ThoughtChunk``)."""
        ...

    def projection(
        self, session_id: str, *, notices: bool = False, compaction: bool = False
    ) -> Projection:
        """A session's updates; ``notices``: the client shows notice updates; ``compaction``:
        it follows compactions (else it is sent none)."""
        ...

    def config_options(
        self,
        choices: ModelChoices,
        current_model: str,
        *,
        locked: bool,
        settings: SessionSettings,
    ) -> Any:
        """The session's config options (the model only offers itself once locked)."""
        ...

    def client_features(self, request: Any) -> tuple[bool, bool, bool]:
        """From the ``initialize`` request: (form elicitation, notice updates, compaction
        updates) the client takes."""
        ...

    def initialize_answer(self, answer: InitializeResponse) -> object:
        """This version's ``initialize`` answer, from the host's (version 1) one."""
        ...

    def replay_requested(self, request: Any) -> bool:
        """Whether a ``session/resume`` asks for the history (``-32602`` for a cursor this
        agent cannot serve)."""
        ...

    def new_answer(self, session_id: str, options: Any, settings: SessionSettings) -> object: ...

    def load_answer(self, options: Any, settings: SessionSettings) -> object: ...

    def fork_answer(self, session_id: str, options: Any, settings: SessionSettings) -> object: ...

    def resume_answer(self, options: Any, settings: SessionSettings) -> object: ...

    def prompt_answer(
        self, state: RunState, usage: Usage | None = None, reason: StopReason = ...
    ) -> object:
        """A prompt's answer: stop reason and exactly this turn's usage."""
        ...

    def acceptance_answer(self, message_id: str) -> object:
        """The prompt's answer once its message is inserted (see
        :attr:`answers_on_acceptance`)."""
        ...

    def steering_answer(
        self, outcome: Literal["injected", "startedNewTurn", "promptRequired"], reason: str | None
    ) -> object:
        """The answer to ``_session/steering``."""
        ...

    def permission_answer(self, response: Any) -> str:
        """The runtime responder's word for the client's answer (:data:`FAIL_CLOSED` for
        anything but a clean allow-once or reject-once)."""
        ...

    def mode_answer(self) -> object:
        """The answer to a mode change the runtime accepted."""
        ...

    def config_change(self, config_id: str, value: object) -> ConfigChange:
        """The setting a config change asks for, or ``-32602`` for an unknown option or a
        malformed value."""
        ...

    def config_answer(self, options: Any) -> object: ...
