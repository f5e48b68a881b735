"""What a request handler may ask of the peer that runs it, from inside its own task.

The peer runs each inbound request's handler in a task of its own and gives it three things
through context variables (:func:`enter_handler`): when its request arrived
(:func:`request_arrival`), how to say it has decided (:func:`admitted`) and a place for the
messages that must follow its answer (:func:`after_answer`). Also the handler signatures and
the error a handler raises for a method it does not implement. No I/O here.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeAlias

from maple_acp.wire.errors import METHOD_NOT_FOUND, ProtocolError

from ._envelope import Params

RequestHandler: TypeAlias = Callable[[str, Params], Awaitable[Any]]
#: A request's ordering key from its method and params (see ``rpc._admission``).
OrderKey: TypeAlias = Callable[[str, Params], Hashable | None]
NotificationHandler: TypeAlias = Callable[[str, Params], Awaitable[None]]
#: A send a handler asked for once its answer is queued.
FollowUp: TypeAlias = Callable[[], Awaitable[None]]

#: The inbound frame index (see ``JsonRpcPeer.frames_received``) of the request whose handler
#: is running in the current task.
_ARRIVAL: contextvars.ContextVar[int] = contextvars.ContextVar("maple_acp_rpc_arrival", default=0)

#: Sends a request handler asked to make once its answer is queued (see :func:`after_answer`).
_FOLLOW_UPS: contextvars.ContextVar[list[FollowUp] | None] = contextvars.ContextVar(
    "maple_acp_rpc_follow_ups", default=None
)

#: Marks the current request handler's request admitted (see :func:`admitted`).
_ADMIT: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "maple_acp_rpc_admit", default=None
)


def enter_handler(arrival: int, admit: Callable[[], None]) -> list[FollowUp]:
    """In a request's task, before its handler runs: the request arrived as frame
    ``arrival`` and ``admit`` admits it. Returns the list its handler's follow-ups go to."""
    _ARRIVAL.set(arrival)
    _ADMIT.set(admit)
    follow_ups: list[FollowUp] = []
    _FOLLOW_UPS.set(follow_ups)
    return follow_ups


def after_answer(send: FollowUp) -> None:
    """In a request handler: call ``send`` in the request's task right after its (successful)
    answer is queued, for messages the other side must not see before the answer (updates
    about a session whose id the answer carries). Not called if the handler fails."""
    follow_ups = _FOLLOW_UPS.get()
    if follow_ups is None:
        raise RuntimeError("after_answer() is for request handlers")
    follow_ups.append(send)


def admitted() -> None:
    """In a request handler: its request has made its decision (claimed what it claims,
    chosen what it chooses). Requests that arrived after it and are ordered against it (see
    ``order_key`` of :class:`JsonRpcPeer`) may decide from now on, while this one's work goes
    on. Without this call a request counts as admitted when its handler ends. Idempotent;
    also valid in a task the handler started."""
    admit = _ADMIT.get()
    if admit is None:
        raise RuntimeError("admitted() is for request handlers")
    admit()


def request_arrival() -> int:
    """In a request handler: the inbound frame index at which its request arrived.

    Handlers start as tasks after the reader has moved on, so a notification that arrived
    later may already have been handled; comparing its ``frames_received`` with this index
    tells which came first."""
    return _ARRIVAL.get()


def method_not_found(method: str) -> ProtocolError:
    """The error a request handler raises for a method it does not implement."""
    return ProtocolError(METHOD_NOT_FOUND, f"method not found: {method}")
