"""Ready-made params for the hot streaming path and for the goal extension's ``_meta`` slots."""

from typing import Any, Final, Literal

from ._content import Meta
from ._converter import unstructure
from ._extensions import GoalCapability, GoalSnapshot
from ._updates import SessionInfoUpdate

ChunkKind = Literal["user_message_chunk", "agent_message_chunk", "agent_thought_chunk"]
_CHUNK_KINDS: Final = frozenset(
    ("user_message_chunk", "agent_message_chunk", "agent_thought_chunk")
)


def text_chunk_update(
    session_id: str, kind: ChunkKind, message_id: str, text: str
) -> dict[str, Any]:
    """``session/update`` params for one text chunk, built as a plain dict.

    Streaming sends one of these per model token batch; building the attrs objects and
    unstructuring them costs about 14 times the JSON encoding, so this path skips them. The
    result equals ``unstructure(SessionNotification(...))`` of the same chunk, key order included.
    """
    if kind not in _CHUNK_KINDS:
        raise ValueError(f"not a text chunk kind: {kind!r}")
    return {
        "sessionId": session_id,
        "update": {
            "sessionUpdate": kind,
            "content": {"type": "text", "text": text},
            "messageId": message_id,
        },
    }


def goal_capability_meta(capability: GoalCapability) -> Meta:
    """The ``_meta`` of an initialize response that advertises the goal extension."""
    return {"goal": unstructure(capability)}


def goal_info_update(
    snapshot: GoalSnapshot | None, *, title: str | None = None
) -> SessionInfoUpdate:
    """A ``session_info_update`` publishing ``snapshot``; ``None`` publishes ``goal: null``."""
    goal = None if snapshot is None else unstructure(snapshot)
    return SessionInfoUpdate(title=title, meta={"goal": goal})
