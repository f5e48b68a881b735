"""What differs between protocol versions, as one object per version chosen at ``initialize``.

A :class:`Dialect` holds the method table (method -> params type and the version-neutral
operation that serves it), the projection of runtime events and stored history into updates
(one :class:`Projection` per session) and the answer shapes (session open answers, the prompt
answer, modes and config options, the permission question). The flows (``_opening``,
``_closing``, ``_turn``, ``_trust``, ``_goals``) call these and never build a
version-specific shape themselves, so a second version is a second dialect, not version checks
in the flows. ``_v1`` is the one there is today.

Nothing here does I/O: resource handling, errors and cancellation are the flows'. A dialect
refuses bad input with ``ProtocolError(-32602)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol

import attrs

from maple_acp.edge._projection import Outbound, SessionSettings
from maple_acp.model import CommandInfo, GoalRecord, MessageRow, TimelineItem
from maple_acp.runtime import ModelChoices, RunEvent, RunState, StopReason, ToolRequest, Usage

__all__ = [
    "FAIL_CLOSED",
    "ConfigChange",
    "Dialect",
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

    def current_mode(self, mode_id: str) -> Outbound: ...

    def history(self, rows: Sequence[TimelineItem | MessageRow]) -> Iterable[Outbound]: ...

    def permission_request(self, request: ToolRequest) -> Any:
        """The client method's request that asks about ``request`` (the channel sends it)."""
        ...


class Dialect(Protocol):
    """One protocol version. See the module docstring."""

    @property
    def version(self) -> int: ...

    @property
    def routes(self) -> Mapping[str, Route]: ...

    @property
    def chunk_kinds(self) -> Mapping[type, Any]:
        """The update kind of each text event type (``TextChunk``, ``ThoughtChunk``)."""
        ...

    def projection(self, session_id: str, *, notices: bool = False) -> Projection:
        """A session's updates; ``notices``: the client shows notice updates."""
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

    def new_answer(self, session_id: str, options: Any, settings: SessionSettings) -> object: ...

    def load_answer(self, options: Any, settings: SessionSettings) -> object: ...

    def fork_answer(self, session_id: str, options: Any, settings: SessionSettings) -> object: ...

    def resume_answer(self, options: Any, settings: SessionSettings) -> object: ...

    def prompt_answer(
        self, state: RunState, usage: Usage | None = None, reason: StopReason = ...
    ) -> object:
        """A prompt's answer: stop reason and exactly this turn's usage."""
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
