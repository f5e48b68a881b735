"""``_session/queue`` and ``_session/queue_changed``: a client sees a session's waiting prompts
and withdraws one or all of them.

The queue is the lease's (``SessionLease.queue_prompt``, ``queued_prompts``,
``remove_queued``, ``cancel_queued``); this flow only checks the request and shapes the
answer and the notification. A withdrawn prompt is answered by its own request, as cancelled
in its version's way (v1 ``{stopReason: "cancelled"}``, v2 ``-32800``). Errors: an unknown
session is ``-32002``; a ``remove`` without an ``entryId``, or with one that no waiting prompt
has, is ``-32602`` naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from maple_acp.edge._sessions import SessionTable
from maple_acp.runtime import QueuedPrompt
from maple_acp.wire import (
    INVALID_PARAMS,
    ProtocolError,
    QueueChangedNotification,
    QueueEntry,
    QueueRequest,
    QueueResponse,
)

#: An entry id echoed in a refusal, at most (the ids we give are short).
MAX_ECHOED_ENTRY_CHARS: Final = 40


def queue_entries(entries: Sequence[QueuedPrompt]) -> tuple[QueueEntry, ...]:
    """The waiting prompts as the wire lists them, ``queuedAt`` in RFC 3339 (UTC)."""
    return tuple(
        QueueEntry(
            entry_id=entry.entry_id,
            preview=entry.preview,
            queued_at=datetime.fromtimestamp(entry.queued_ms / 1000, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
        )
        for entry in entries
    )


def queue_changed(session_id: str, entries: Sequence[QueuedPrompt]) -> QueueChangedNotification:
    """The params of ``_session/queue_changed``: the session's waiting prompts now."""
    return QueueChangedNotification(session_id=session_id, entries=queue_entries(entries))


class QueueFlow:
    """``_session/queue`` for one connection's sessions."""

    def __init__(self, table: SessionTable) -> None:
        self._table = table

    async def control(self, request: QueueRequest) -> QueueResponse:
        lease = self._table.live(request.session_id).lease
        with lease.operation():
            if request.action == "list":
                return QueueResponse(entries=queue_entries(lease.queued_prompts))
            if request.action == "clear":
                lease.cancel_queued()
                return QueueResponse()
            entry_id = request.entry_id
            if entry_id is None:
                raise ProtocolError(INVALID_PARAMS, "entryId: remove names the prompt to remove")
            if not lease.remove_queued(entry_id):
                shown = entry_id[:MAX_ECHOED_ENTRY_CHARS]
                raise ProtocolError(
                    INVALID_PARAMS, f"entryId: no waiting prompt {shown!r} in this session"
                )
            return QueueResponse()
