"""The inbound requests of one connection: each in a task of its own, decided in arrival
order, answered alone or in its batch's answer, its follow-ups after.

The reader hands each request over as it reads it (:meth:`InboundRequests.start`) and goes
on; what can be refused at once (an id in use, one request too many) comes back to the reader
to answer. A request's task waits for its admission turn (``rpc._admission``), runs the
handler in a cancel scope that ``$/cancel_request`` reaches, and queues the answer through
the peer's ``send``: the answer's outbound credit is the peer's business, not this module's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import Any, Final

import trio

from maple_acp._groups import single_exception
from maple_acp.wire.errors import INTERNAL_ERROR, INVALID_REQUEST, REQUEST_CANCELLED, ProtocolError

from ._admission import AdmissionGate
from ._answers import BatchAnswer, encode_answer, internal_error, unwrap_protocol_error
from ._envelope import Params, Request, RequestId, encode_error
from ._exceptions import ConnectionClosed, OutboundFrameTooLarge
from ._handling import FollowUp, OrderKey, RequestHandler, enter_handler, method_not_found
from ._transport import Route

logger = logging.getLogger(__name__)

#: Inbound requests handled at once; each holds a task, so a client that floods requests and
#: never reads its answers cannot grow them without bound. One more is refused ``-32600``
#: naming this limit: the client's doing, which it can fix by waiting for answers.
MAX_CONCURRENT_REQUESTS: Final = 256
#: The notification that cancels one in-flight inbound request (ACP ``$/cancel_request``).
CANCEL_REQUEST_METHOD: Final = "$/cancel_request"


class InboundRequests:
    """The requests of one connection whose answers are not queued yet.

    ``send`` queues a line on a route (an answer takes its request's), waiting for outbound
    credit; ``closed`` tells whether the
    connection has ended (then a handler's :class:`ConnectionClosed` is a normal end)."""

    def __init__(
        self,
        *,
        on_request: RequestHandler | None,
        order_key: OrderKey | None,
        max_concurrent: int,
        send: Callable[[bytes, Route], Awaitable[None]],
        closed: Callable[[], bool],
    ) -> None:
        if not 1 <= max_concurrent <= MAX_CONCURRENT_REQUESTS:
            raise ValueError(f"max_concurrent_requests must be in 1..{MAX_CONCURRENT_REQUESTS}")
        self._on_request = on_request
        self._order_key = order_key
        self._max_concurrent = max_concurrent
        self._send = send
        self._closed = closed
        self.admission = AdmissionGate()
        self._inflight: dict[RequestId, trio.CancelScope] = {}
        # Handler tasks still running (answer not yet queued), for the EOF grace.
        self._handlers = 0
        self._handlers_done = trio.Event()

    async def wait_for_handlers(self) -> None:
        """Return once no handler task is running (their answers are queued)."""
        while self._handlers:
            await self._handlers_done.wait()

    def cancel(self, params: Params) -> None:
        """``$/cancel_request``: cancel the named request if it is in flight."""
        if type(params) is not dict or "requestId" not in params:
            logger.debug("ignoring a malformed %s", CANCEL_REQUEST_METHOD)
            return
        target = params["requestId"]
        scope = self._inflight.get(target) if type(target) in (int, str, type(None)) else None
        if scope is None:
            logger.debug("%s for %r: no such request in flight", CANCEL_REQUEST_METHOD, target)
            return
        scope.cancel()

    def start(
        self,
        request: Request,
        arrival: int,
        nursery: trio.Nursery,
        batch: BatchAnswer | None,
        route: Route = None,
    ) -> bytes | None:
        """Start ``request`` (read as frame ``arrival``, its answer to take ``route``) in a
        task of ``nursery``, or return the refusal the reader must answer it with."""
        if request.id in self._inflight:
            error = ProtocolError(INVALID_REQUEST, "request id is already in use by a request")
            return encode_error(request.id, error)
        if len(self._inflight) >= self._max_concurrent:
            error = ProtocolError(
                INVALID_REQUEST,
                f"too many requests in flight: at most {self._max_concurrent} per connection;"
                " wait for an answer, then retry",
            )
            return encode_error(request.id, error)
        # Registered before the task starts, so a $/cancel_request later in the same read
        # finds it; a scope cancelled before it is entered cancels the handler at once.
        scope = trio.CancelScope()
        self._inflight[request.id] = scope
        self._handlers += 1
        if self._order_key is not None:
            key: Hashable | None = self._order_key(request.method, request.params)
            self.admission.enter(arrival, key)
        slot = None
        if batch is not None:
            batch.handled = True
            slot = (batch, batch.slot(request.id))
        nursery.start_soon(self._run, request, scope, arrival, slot, route)
        return None

    async def _run(
        self,
        request: Request,
        scope: trio.CancelScope,
        arrival: int,
        slot: tuple[BatchAnswer, int] | None,
        route: Route,
    ) -> None:
        try:
            await self._handle(request, scope, arrival, slot, route)
        finally:
            self._handlers -= 1
            if self._handlers == 0:
                self._handlers_done.set()
                self._handlers_done = trio.Event()

    async def _handle(
        self,
        request: Request,
        scope: trio.CancelScope,
        arrival: int,
        slot: tuple[BatchAnswer, int] | None,
        route: Route,
    ) -> None:
        admit = partial(self.admission.admit, arrival)
        follow_ups = enter_handler(arrival, admit)
        error: ProtocolError | None = None
        result: Any = None
        returned = False
        try:
            with scope:
                try:
                    if self._on_request is None:
                        raise method_not_found(request.method)
                    if not self.admission.ready(arrival):
                        await self.admission.turn(arrival)
                    result = await self._on_request(request.method, request.params)
                    returned = True
                finally:
                    del self._inflight[request.id]
                    admit()
        except Exception as exc:
            if self._closed() and isinstance(single_exception(exc), ConnectionClosed):
                # The connection ended under the handler (a client gone mid-stream): a normal
                # end of the request, and there is nobody left to answer.
                logger.debug("%r ended with the connection", request.method)
                return
            error = unwrap_protocol_error(exc)
            if error is None:
                error = internal_error(request.method, exc)
        if error is None and not returned:
            error = ProtocolError(REQUEST_CANCELLED, "request cancelled")
        line = encode_answer(request, result, error)
        if slot is not None:
            await self._answer_in_batch(slot, line, follow_ups if error is None else [])
            return
        try:
            try:
                await self._send(line, route)
            except OutboundFrameTooLarge as exc:
                logger.warning("answer to %r not sent: %s", request.method, exc)
                error = ProtocolError(INTERNAL_ERROR, "internal error (answer too large)")
                await self._send(encode_error(request.id, error), route)
            if error is None:
                for send in follow_ups:
                    await send()
        except ConnectionClosed:
            logger.debug("answer to %r not sent: the connection ended", request.method)

    async def _answer_in_batch(
        self, slot: tuple[BatchAnswer, int], line: bytes, follow_ups: list[FollowUp]
    ) -> None:
        """Put a batch member's answer in the batch's; the last one sends the array. Its
        follow-ups go once the array is queued."""
        batch, index = slot
        if batch.fill(index, line):
            await self.send_batch(batch)
        elif follow_ups:
            await batch.sent.wait()
        if not follow_ups or self._closed():
            return
        try:
            for send in follow_ups:
                await send()
        except ConnectionClosed:
            logger.debug("follow-ups of a batch member not sent: the connection ended")

    async def send_batch(self, batch: BatchAnswer) -> None:
        """Queue a batch's one answer; its members' follow-ups wait for this. An array too
        large for the outbound budget has its largest answers replaced by ``-32603``
        ("answer too large") until it fits."""
        try:
            while True:
                try:
                    await self._send(batch.encode(), batch.route)
                    return
                except OutboundFrameTooLarge as exc:
                    logger.warning("a batch answer is cut down: %s", exc)
                    error = ProtocolError(INTERNAL_ERROR, "internal error (answer too large)")
                    if not batch.shrink(error):
                        return
        except ConnectionClosed:
            logger.debug("a batch answer not sent: the connection ended")
        finally:
            batch.sent.set()
