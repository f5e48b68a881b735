"""The text chunk kinds, and ready-made values for the goal and steering extensions' ``_meta``
slots."""

from typing import Literal

from ._content import Meta
from ._converter import unstructure
from ._extensions import GoalCapability, GoalSnapshot
from ._updates import SessionInfoUpdate

ChunkKind = Literal["user_message_chunk", "agent_message_chunk", "agent_thought_chunk"]


def goal_capability_meta(capability: GoalCapability) -> Meta:
    """The ``_meta`` of an initialize response that advertises the goal extension."""
    return {"goal": unstructure(capability)}


def goal_info_update(
    snapshot: GoalSnapshot | None, *, title: str | None = None
) -> SessionInfoUpdate:
    """A ``session_info_update`` publishing ``snapshot``; ``None`` publishes ``goal: null``."""
    goal = None if snapshot is None else unstructure(snapshot)
    return SessionInfoUpdate(title=title, meta={"goal": goal})


def steering_capability_meta() -> Meta:
    """The ``_meta`` entry of an initialize response that advertises ``_session/steering``."""
    return {"steering": {"supported": True}}


def steering_turn_ended(stop_reason: str, usage: Meta | None = None) -> SessionInfoUpdate:
    """A ``session_info_update`` that ends a turn a steering message started (it has no
    ``session/prompt`` answer to carry its stop reason): ``_meta.steering.turnEnded``."""
    ended: Meta = {"stopReason": stop_reason}
    if usage is not None:
        ended["usage"] = usage
    return SessionInfoUpdate(meta={"steering": {"turnEnded": ended}})
