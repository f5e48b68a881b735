"""The permission question of a run, as one window asks it: the holder's connection and each
observing connection ask their own client, each with its own ticket on the question they
share (the runtime's ``SharedQuestion``).

The first clean answer (allow once or reject once) from any window decides; a window whose
client answers ``cancelled`` or with an option it was not offered, or fails, gives up its
ticket only, and the question is denied once no window is left. A window that did not decide
sees its request withdrawn (``$/cancel_request``) and the tool call's state as decided
(``tool_call_update``).

Cancellation: the run's end or the session's close cancels the asking task; its ticket is
then withdrawn (a question nobody can answer any more is denied by the runtime).
"""

from __future__ import annotations

import contextlib
import logging

import trio

from maple_acp.edge._client import ClientChannel
from maple_acp.edge._dialect import permission_answer
from maple_acp.edge._session import EdgeSession
from maple_acp.model import ToolState, ToolStatus
from maple_acp.rpc import ConnectionClosed, OutboundFrameTooLarge
from maple_acp.runtime import PermissionAnswer, PermissionRequest, PermissionTicket
from maple_acp.wire import ProtocolError, RequestPermissionResponse

logger = logging.getLogger(__name__)


async def ask_permission(
    channel: ClientChannel, session: EdgeSession, event: PermissionRequest
) -> None:
    """Ask this window's client; anything but a clean allow-once/reject-once gives up this
    window's part (and, for a window alone, fails closed)."""
    answer: PermissionAnswer | None = None  # give up unless the client answers cleanly
    projector = session.projector
    responder = event.responder
    settled = responder.settled if isinstance(responder, PermissionTicket) else None
    decided_here = False
    try:
        # While it waits the turn requires action (in a version that says so).
        await channel.send_many(session.id, projector.permission_waiting())
        question = projector.permission_request(event.request)
        if settled is None:
            answer = permission_answer(await channel.request_permission(session.id, question))
        else:
            response = await _ask_until_settled(channel, session.id, question, settled)
            if response is not None:
                answer = permission_answer(response)
    except (ProtocolError, ConnectionClosed, OutboundFrameTooLarge) as exc:
        logger.info("permission request failed closed: %s", getattr(exc, "message", exc))
    finally:
        # Cancellation (the run ended, the session closed) lands here too: the responder
        # then refuses the late answer and the run's own cancellation already denied it.
        decided_here = responder.answer(answer)
    with contextlib.suppress(ConnectionClosed):
        await channel.send_many(session.id, projector.permission_settled())
        if settled is not None and settled.is_set() and not decided_here:
            await _decided_elsewhere(channel, session, event)


async def _ask_until_settled(
    channel: ClientChannel, session_id: str, question: object, settled: trio.Event
) -> RequestPermissionResponse | None:
    """The client's answer, or ``None`` once another window decided first (the request is
    then withdrawn). A failed request raises its one error."""
    response: RequestPermissionResponse | None = None
    failure: Exception | None = None
    try:
        async with trio.open_nursery() as nursery:

            async def withdraw_once_settled() -> None:
                await settled.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(withdraw_once_settled)
            response = await channel.request_permission(session_id, question, withdraw=True)
            nursery.cancel_scope.cancel()
    except* (ProtocolError, ConnectionClosed, OutboundFrameTooLarge) as group:
        failure = group.exceptions[0]
    if failure is not None:
        raise failure
    return response


async def _decided_elsewhere(
    channel: ClientChannel, session: EdgeSession, event: PermissionRequest
) -> None:
    """Another window decided: this window's client sees the tool call's state as decided."""
    request = event.request
    status = ToolStatus.IN_PROGRESS if event.responder.allowed else ToolStatus.FAILED
    row = ToolState(
        name=request.name, status=status, title=request.title, raw_input=request.raw_input
    )
    try:
        await channel.send(session.id, session.projector.tool(request.tool_id, row))
    except OutboundFrameTooLarge as exc:
        logger.info("a decided permission's row was not sent: %s", exc)
