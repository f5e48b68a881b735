"""Child sessions on the wire: what a run's ``ChildReport`` events become for the client.

A client that shows child sessions (every v2 client; a v1 client that advertised
``clientCapabilities.subagents``) sees each child as a session of its own: the parent's
``subagent_update`` announces it before anything names it, the child's own updates carry its
``sessionId``, the delegation and the answer are ``session_message`` upserts on the parent's
stream (``senderSessionId`` and ``recipientSessionId`` both set), and the parent's
``subagent_update`` patches the child's state (``running``, ``requires_action`` while one of
its permission questions waits, ``idle`` with its stop reason). Each child advertises
``cancel``: a ``session/cancel`` naming it stops it alone (:func:`cancel_child`).

Any other client sees a child as the delegate tool call it is, its text streamed as that
call's content; the child's permission questions are asked with the parent's ``sessionId``
and the delegate call's id, and once answered the call is sent again as it was (the client
applied the question's tool to it). Every permission question fails closed as the parent's do.

Updates are built as finished lines here (the wire's typed updates have no child shapes);
a child's own events go through a projection of the session's dialect for the child's id.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final

import attrs
import trio

from maple_acp.edge._bounds import MAX_TOOL_TEXT_CHARS, bound_text
from maple_acp.edge._client import ClientChannel
from maple_acp.edge._dialect import (
    Dialect,
    ImageSlot,
    Outbound,
    Projection,
    permission_answer,
    stop_reason,
)
from maple_acp.edge._projection import UPDATE_METHOD
from maple_acp.model import ItemKind, MessageRow, TaskRecord, TimelineItem
from maple_acp.rpc import ConnectionClosed, OutboundFrameTooLarge, encode_notification
from maple_acp.runtime import (
    ChildAnnounced,
    ChildEnded,
    ChildEvent,
    ChildReport,
    ChildRunning,
    PermissionAnswer,
    PermissionRequest,
    RunEnded,
    RunState,
    SessionLease,
    StopReason,
    TextChunk,
    ThoughtChunk,
)
from maple_acp.wire import ProtocolError

logger = logging.getLogger(__name__)

#: A client that sees a child as its delegate call gets the whole text so far each time
#: (a content update replaces the call's content): at most once per this many new
#: characters, and before any other event of the child, so the frames stay linear in size.
TOOL_TEXT_STEP_CHARS: Final = 256
#: The name of the tool call that delegates to a child (the engines' and the demo's).
DELEGATE_TOOL: Final = "delegate"
#: The event types a pump hands to :meth:`SessionChildren.relay`.
CHILD_REPORTS: Final = (ChildAnnounced, ChildRunning, ChildEvent, ChildEnded)


def _line(session_id: str, kind: str, body: dict[str, Any]) -> bytes:
    return encode_notification(
        UPDATE_METHOD, {"sessionId": session_id, "update": {"sessionUpdate": kind, **body}}
    )


def _text(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


def subagent_update(parent_id: str, child_id: str, **fields: Any) -> bytes:
    """The parent's ``subagent_update`` about ``child_id`` (patch fields as given)."""
    return _line(parent_id, "subagent_update", {"sessionId": child_id, **fields})


def announcement(parent_id: str, child_id: str, title: str) -> bytes:
    """The first ``subagent_update`` of a child: its title, and ``cancel`` permitted."""
    return subagent_update(parent_id, child_id, title=title, capabilities={"cancel": {}})


def session_message(
    parent_id: str,
    message_id: str,
    *,
    sender: str,
    recipient: str,
    text: str,
    references: dict[str, str] | None = None,
) -> bytes:
    body = {
        "messageId": message_id,
        "senderSessionId": sender,
        "recipientSessionId": recipient,
        **(references or {}),
        "content": _text(text),
    }
    return _line(parent_id, "session_message", body)


def delegation_message(parent_id: str, child_id: str, tool_id: str, prompt: str) -> bytes:
    """The parent-to-child message: the delegation prompt."""
    return session_message(
        parent_id, f"{tool_id}-prompt", sender=parent_id, recipient=child_id, text=prompt
    )


def answer_message(
    parent_id: str, child_id: str, tool_id: str, answer: str, answer_id: str
) -> bytes:
    """The child-to-parent message: the child's answer (its id in the child's transcript as
    ``senderMessageId`` when it has one)."""
    return session_message(
        parent_id,
        f"{tool_id}-answer",
        sender=child_id,
        recipient=parent_id,
        text=answer,
        references={"senderMessageId": answer_id} if answer_id else None,
    )


def idle_state(state: RunState, reason: StopReason) -> dict[str, Any]:
    return {"state": "idle", "stopReason": stop_reason(state, reason)}


#: How the opener sends a run of history rows (``SessionOpener._send_history``).
HistorySender = Callable[
    [
        str,
        Projection,
        Sequence[TimelineItem | MessageRow],
        Callable[[str], Awaitable[bytes | None]],
    ],
    Awaitable[None],
]


def _outbound(updates: Iterable[Outbound | ImageSlot]) -> list[Outbound]:
    # A child's history carries no images (its one user message is the delegation text).
    return [update for update in updates if not isinstance(update, ImageSlot)]


@attrs.define
class _Child:
    """One announced child as the client sees it."""

    tool_id: str
    projection: Projection
    #: The delegation's title and prompt: its delegate call as the client first saw it.
    title: str = ""
    prompt: str = ""
    #: Its permission questions waiting now (``requires_action`` while any does).
    waiting: int = 0
    #: The child's text so far, for a client that sees the child as a tool call, and how
    #: much of it that client has not been sent yet.
    text: str = ""
    unsent: int = 0
    message_id: str = ""
    ended: bool = False


class SessionChildren:
    """The children of one session as its client sees them (see the module docstring)."""

    def __init__(
        self,
        session_id: str,
        dialect: Dialect,
        *,
        visible: bool,
        notices: bool = False,
        compaction: bool = False,
        plans: bool = False,
    ) -> None:
        self._session_id = session_id
        self._dialect = dialect
        #: The client shows child sessions (else a child is its delegate tool call).
        self.visible = visible
        self._options = {"notices": notices, "compaction": compaction, "plans": plans}
        self._children: dict[str, _Child] = {}

    def knows(self, child_id: str) -> bool:
        """Whether the client was told of child ``child_id`` (only a visible child is)."""
        return self.visible and child_id in self._children

    def _child(self, announced: ChildAnnounced) -> _Child:
        child = self._children.get(announced.child_id)
        if child is None:
            projection = self._dialect.projection(announced.child_id, **self._options)
            child = self._children[announced.child_id] = _Child(
                announced.tool_id, projection, announced.title, announced.prompt
            )
        return child

    # -- replay ----------------------------------------------------------------------------

    async def replay(
        self,
        channel: ClientChannel,
        projector: Projection,
        rows: Sequence[TimelineItem | MessageRow],
        children: Sequence[tuple[TaskRecord, Sequence[TimelineItem | MessageRow]]],
        send_history: HistorySender,
        image_data: Callable[[str], Awaitable[bytes | None]],
    ) -> None:
        """Replay the parent's ``rows`` with each child announced right after the call that
        delegated it and its transcript after the announcement, in stored order."""
        parent_id = self._session_id
        plans = bool(self._options["plans"])
        for segment, indexes in replay_segments(latest_plan_only(rows), children):
            if segment:
                await send_history(parent_id, projector, segment, image_data)
            for index in indexes:
                child, child_rows = children[index]
                before, transcript, after = replayed_child(
                    parent_id, self._dialect, child, child_rows, plans=plans
                )
                await channel.send_many(parent_id, before)
                await channel.send_many(child.id, transcript)
                await channel.send_many(parent_id, after)

    # -- live ------------------------------------------------------------------------------

    async def relay(
        self,
        channel: ClientChannel,
        parent: Projection,
        event: ChildReport,
        permissions: trio.Nursery,
    ) -> None:
        """Send what ``event`` shows; a child's permission question is asked in
        ``permissions`` (the pump's nursery, which ends with the parent's turn)."""
        parent_id = self._session_id
        if isinstance(event, ChildAnnounced):
            child = self._child(event)
            if self.visible:
                await channel.send_many(
                    parent_id,
                    [
                        announcement(parent_id, event.child_id, event.title),
                        delegation_message(parent_id, event.child_id, event.tool_id, event.prompt),
                    ],
                )
                prompt = TimelineItem(
                    item_id=event.prompt_message_id,
                    kind=ItemKind.USER,
                    created_ms=0,
                    text=event.prompt,
                )
                await channel.send_many(
                    event.child_id, _outbound(child.projection.history([prompt]))
                )
            return
        known = self._children.get(event.child_id)
        if known is None:
            return  # never announced: nothing may name it
        child = known
        if isinstance(event, ChildRunning):
            if self.visible:
                running = subagent_update(parent_id, event.child_id, state={"state": "running"})
                await channel.send_many(parent_id, [running])
                await channel.send_many(event.child_id, child.projection.run_started())
        elif isinstance(event, ChildEnded):
            child.ended = True
            if not self.visible:
                await self._send_tool_text(channel, child)
            else:
                outcome = event.outcome
                await channel.send_many(
                    parent_id,
                    [
                        answer_message(
                            parent_id,
                            event.child_id,
                            child.tool_id,
                            event.answer,
                            event.answer_message_id,
                        ),
                        subagent_update(
                            parent_id,
                            event.child_id,
                            state=idle_state(outcome.state, outcome.stop_reason),
                        ),
                    ],
                )
        else:
            await self._inner(channel, parent, event.child_id, child, event.event, permissions)

    async def settle(self, channel: ClientChannel) -> None:
        """Show each announced child whose end was not relayed as ended, cancelled: when the
        runtime revokes a session's lease, its updates stop before the run's last events are
        read, and the turn's children end with it; a client must not keep showing them
        running."""
        parent_id = self._session_id
        for child_id, child in self._children.items():
            if child.ended:
                continue
            child.ended = True
            if self.visible:
                ended = idle_state(RunState.CANCELLED, StopReason.END_TURN)
                with contextlib.suppress(ConnectionClosed):
                    await channel.send_many(
                        parent_id, [subagent_update(parent_id, child_id, state=ended)]
                    )

    async def _inner(
        self,
        channel: ClientChannel,
        parent: Projection,
        child_id: str,
        child: _Child,
        event: object,
        permissions: trio.Nursery,
    ) -> None:
        if isinstance(event, PermissionRequest):
            permissions.start_soon(self._ask, channel, parent, child_id, child, event)
            return
        if not self.visible:
            if isinstance(event, TextChunk) and len(child.text) < MAX_TOOL_TEXT_CHARS:
                # Each of the child's messages a paragraph of its own.
                gap = "\n\n" if child.text and event.message_id != child.message_id else ""
                child.message_id = event.message_id
                child.text = bound_text(child.text + gap + event.text)
                child.unsent += len(event.text)
                if child.unsent < TOOL_TEXT_STEP_CHARS:
                    return
            await self._send_tool_text(channel, child)
            return
        projection = child.projection
        if isinstance(event, TextChunk | ThoughtChunk):
            kind = self._dialect.chunk_kinds[type(event)]
            await channel.send_many(child_id, projection.text(kind, event.message_id, event.text))
        elif isinstance(event, RunEnded):
            outcome = event.outcome
            await channel.send_many(
                child_id, projection.run_ended(outcome.state, outcome.stop_reason)
            )
        else:
            update = projection.event(event)  # type: ignore[arg-type]
            if isinstance(update, list):
                await channel.send_many(child_id, update)
            elif update is not None:
                await channel.send(child_id, update)

    async def _send_tool_text(self, channel: ClientChannel, child: _Child) -> None:
        """The child's text so far as its delegate call's content (a client that does not
        show children), if some of it was not sent yet."""
        if not child.unsent:
            return
        child.unsent = 0
        content = [{"type": "content", "content": _text(child.text)[0]}]
        body = {"toolCallId": child.tool_id, "content": content}
        await channel.send_many(
            self._session_id, [_line(self._session_id, "tool_call_update", body)]
        )

    async def _ask(
        self,
        channel: ClientChannel,
        parent: Projection,
        child_id: str,
        child: _Child,
        event: PermissionRequest,
    ) -> None:
        """Ask a child's permission question; anything but a clean allow-once or reject-once
        fails closed (in the child: its parent's turn goes on)."""
        answer: PermissionAnswer | None = None
        parent_id = self._session_id
        child.waiting += 1
        try:
            answer = await self._question(channel, parent, child_id, child, event)
        finally:
            child.waiting -= 1
            event.responder.answer(answer)
        if self.visible:
            with contextlib.suppress(ConnectionClosed):
                await channel.send_many(child_id, child.projection.permission_settled())
                if child.waiting == 0 and not child.ended:
                    running = {"state": "running"}
                    await channel.send_many(
                        parent_id, [subagent_update(parent_id, child_id, state=running)]
                    )

    async def _question(
        self,
        channel: ClientChannel,
        parent: Projection,
        child_id: str,
        child: _Child,
        event: PermissionRequest,
    ) -> PermissionAnswer | None:
        """The client's answer to a child's question (``None``: no usable answer). Asked as
        the delegate call's question, it is followed, before the child hears the answer,
        by the delegate call as it was: a client applies the question's ``toolCall`` (the
        child's tool, ``pending``) to that call, which would otherwise read as a question
        still waiting for as long as the child goes on."""
        answer: PermissionAnswer | None = None
        parent_id = self._session_id
        try:
            if self.visible:
                if child.waiting == 1:
                    waiting = {"state": "requires_action"}
                    await channel.send_many(
                        parent_id, [subagent_update(parent_id, child_id, state=waiting)]
                    )
                await channel.send_many(child_id, child.projection.permission_waiting())
                question = child.projection.permission_request(event.request)
                response = await channel.request_permission(child_id, question)
            else:
                # Asked as the delegate tool call's question, on the parent's session.
                request = attrs.evolve(event.request, tool_id=child.tool_id)
                response = await channel.request_permission(
                    parent_id, parent.permission_request(request)
                )
            answer = permission_answer(response)
        except (ProtocolError, ConnectionClosed, OutboundFrameTooLarge) as exc:
            logger.info(
                "a child's permission request failed closed: %s", getattr(exc, "message", exc)
            )
        if not self.visible:
            with contextlib.suppress(ConnectionClosed, OutboundFrameTooLarge):
                await channel.send_many(parent_id, [_delegate_call_again(parent_id, child)])
        return answer


def _delegate_call_again(parent_id: str, child: _Child) -> bytes:
    """The delegate call's row as the client first saw it, ``in_progress``."""
    body = {
        "toolCallId": child.tool_id,
        "title": child.title,
        "name": DELEGATE_TOOL,
        "kind": "other",
        "status": "in_progress",
        "rawInput": {"title": child.title, "prompt": bound_text(child.prompt)},
    }
    return _line(parent_id, "tool_call_update", body)


def latest_plan_only(
    rows: Sequence[TimelineItem | MessageRow],
) -> list[TimelineItem | MessageRow]:
    """``rows`` without any plan but the latest: a replay cut into runs must still send only
    the plan the whole history ends with (each run's projection sends its own latest)."""
    plans = [
        index
        for index, row in enumerate(rows)
        if not isinstance(row, MessageRow) and row.kind is ItemKind.PLAN
    ]
    dropped = set(plans[:-1])
    return [row for index, row in enumerate(rows) if index not in dropped]


def replay_segments(
    rows: Sequence[TimelineItem | MessageRow], children: Sequence[tuple[TaskRecord, object]]
) -> list[tuple[list[TimelineItem | MessageRow], list[int]]]:
    """The parent's ``rows`` cut after each row that delegated to a child: each run of rows
    with the indexes (in ``children``) of the children replayed right after it, in stored
    order. A child whose delegating row is not there comes at the end."""
    after: dict[str, list[int]] = {}
    placed: set[int] = set()
    ids = {row.item_id for row in rows}
    for index, (child, _) in enumerate(children):
        if child.parent_tool_id is not None and child.parent_tool_id in ids:
            after.setdefault(child.parent_tool_id, []).append(index)
            placed.add(index)
    segments: list[tuple[list[TimelineItem | MessageRow], list[int]]] = []
    current: list[TimelineItem | MessageRow] = []
    seen: set[str] = set()
    for row in rows:
        current.append(row)
        # A tool call has several rows (its states); it is placed after the first.
        if row.item_id in after and row.item_id not in seen:
            seen.add(row.item_id)
            segments.append((current, after[row.item_id]))
            current = []
    rest = [index for index in range(len(children)) if index not in placed]
    segments.append((current, rest))
    return segments


def replayed_child(
    parent_id: str,
    dialect: Dialect,
    child: TaskRecord,
    rows: Sequence[TimelineItem | MessageRow],
    *,
    plans: bool,
) -> tuple[list[Outbound], list[Outbound], list[Outbound]]:
    """A stored child as a load or resume replays it: the parent's updates before (its
    announcement, the delegation), the child's own (its transcript), the parent's after (the
    answer, its idle state)."""
    child_id = child.id
    projection = dialect.projection(child_id, plans=plans)
    # A version whose resume replays ends each child's replay once, as its parent's.
    transcript = [*_outbound(projection.history(rows)), *projection.replay_complete()]
    prompt = next((row.text for row in rows if row.kind is ItemKind.USER), "")
    answers = [row for row in rows if row.kind is ItemKind.ASSISTANT]
    call = child.parent_tool_id or child_id
    before: list[Outbound] = [
        announcement(parent_id, child_id, child.title),
        delegation_message(parent_id, child_id, call, prompt),
    ]
    after: list[Outbound] = []
    if answers:
        last = answers[-1]
        after.append(answer_message(parent_id, child_id, call, last.text, last.item_id))
    after.append(subagent_update(parent_id, child_id, state={"state": "idle"}))
    return before, transcript, after


def cancel_child(sessions: Iterable[tuple[SessionChildren, SessionLease]], child_id: str) -> bool:
    """A ``session/cancel`` naming a child this connection was told of: the child's turn
    alone is cancelled. False when no session of the connection shows such a child."""
    for children, lease in sessions:
        if children.knows(child_id):
            return lease.cancel_child(child_id)
    return False
