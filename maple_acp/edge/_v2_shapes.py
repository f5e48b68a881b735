"""The shapes of ACP v2 (draft 2.0.0-alpha.12) frames that its dialect builds: a finished
``session/update`` line, a ``state_update``, a terminal content block, a file edit, config
options keyed by ``configId``, and the names v2 gives tool statuses and message kinds. Pure
functions, no I/O; the dialect (``_v2.py``) decides when each is sent."""

from __future__ import annotations

import base64
from typing import Any, Final

import attrs

from maple_acp.edge._dialect import ConfigOptions
from maple_acp.edge._projection import UPDATE_METHOD
from maple_acp.model import FileDiff, ItemKind, ToolStatus
from maple_acp.rpc import encode_notification
from maple_acp.wire import ChunkKind, SessionConfigBoolean, SessionConfigOption, unstructure, v2

#: v2's name of each tool status.
TOOL_STATUS: Final[dict[ToolStatus, str]] = {
    ToolStatus.PENDING: "pending",
    ToolStatus.IN_PROGRESS: "in_progress",
    ToolStatus.COMPLETED: "completed",
    ToolStatus.FAILED: "failed",
    ToolStatus.CANCELLED: "cancelled",
}
#: The chunk update of each message kind (a live turn streams these).
CHUNK_KIND_OF: Final[dict[str, ChunkKind]] = {
    ItemKind.USER.value: "user_message_chunk",
    ItemKind.ASSISTANT.value: "agent_message_chunk",
    ItemKind.THOUGHT.value: "agent_thought_chunk",
}

#: The whole-message upsert of each message kind (a replay sends these, not chunks).
MESSAGE_KIND_OF: Final[dict[str, str]] = {
    ItemKind.USER.value: "user_message",
    ItemKind.ASSISTANT.value: "agent_message",
    ItemKind.THOUGHT.value: "agent_thought",
}


def state_line(session_id: str, state: str, stop_reason: str | None = None) -> bytes:
    """A ``state_update`` line: ``running``, ``requires_action`` or ``idle`` (with the stop
    reason)."""
    return update_line(
        session_id,
        "state_update",
        v2.V2StateUpdate(state=state, stop_reason=stop_reason),  # type: ignore[arg-type]
    )


def update_line(session_id: str, kind: str, body: object) -> bytes:
    """One finished ``session/update`` line: ``body`` tagged as ``kind``."""
    update = unstructure(body)
    update["sessionUpdate"] = kind
    return encode_notification(UPDATE_METHOD, {"sessionId": session_id, "update": update})


def terminal_block(terminal_id: str) -> dict[str, Any]:
    """The ``terminal`` content block a tool call carries to show a command's terminal."""
    return {"type": "terminal", "terminalId": terminal_id}


def base64_text(text: str) -> str:
    """A terminal chunk's data: the text's UTF-8 bytes in base64."""
    return base64.b64encode(text.encode("utf-8", "surrogatepass")).decode("ascii")


def diff_shape(diff: FileDiff) -> dict[str, Any]:
    """A file edit as v2 shows it: which file changed and how (the text stays in the tool's
    raw output, bounded there)."""
    change = v2.V2DiffChange(operation="add" if diff.old_text is None else "modify", path=diff.path)
    return unstructure(v2.V2Diff(changes=(change,)))  # type: ignore[no-any-return]


def v2_config_options(options: ConfigOptions) -> tuple[v2.V2SessionConfigOption, ...]:
    """The host's config options keyed by ``configId``, as v2 shows them."""
    return tuple(v2_config_option(option) for option in options)


def v2_config_option(option: SessionConfigOption) -> v2.V2SessionConfigOption:
    # v1's fields under v2's names: only ``id`` becomes ``configId``.
    fields = attrs.asdict(option, recurse=False)
    fields["config_id"] = fields.pop("id")
    if isinstance(option, SessionConfigBoolean):
        return v2.V2SessionConfigBoolean(**fields)
    return v2.V2SessionConfigSelect(**fields)
