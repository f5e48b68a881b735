"""The Trio shell of one connection: the reader and the writer over a transport, and the
outbound calls (requests, notifications, the streaming lines) that feed the writer.

Every rule lives beside it: the transports (``_transport``: lines over a byte stream, or whole
messages with their routes), envelopes, credit and who waits for it (``_outflow``),
the inbound requests' tasks and their order (``_inbound``, ``_admission``), answers
(``_answers``). The streaming path (``notify_encoded``, ``notify_lines``) stays inline here.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Final

import trio

from maple_acp.wire.errors import ProtocolError

from ._answers import BatchAnswer
from ._credit import FRAME_OVERHEAD_BYTES, MAX_OUTBOUND_BYTES, MAX_OUTBOUND_LINES, OutboundCredit
from ._envelope import (
    ErrorResponse,
    InvalidMessage,
    Notification,
    Parsed,
    Request,
    RequestId,
    Response,
    check_frame,
    encode_error,
    encode_notification,
    encode_request,
    parse_message,
    split_batch,
)
from ._exceptions import ConnectionClosed, FrameTooLong
from ._faults import PeerFaults, went_away
from ._framing import MAX_LINE_BYTES
from ._handling import NotificationHandler, OrderKey, RequestHandler
from ._inbound import CANCEL_REQUEST_METHOD, MAX_CONCURRENT_REQUESTS, InboundRequests
from ._outflow import OutboundFlow
from ._pending import OutgoingCall, PendingRequests
from ._transport import MessageTransport, Route, as_transport, capped

logger = logging.getLogger(__name__)

#: The writer hands queued lines to the transport in batches of about this size (one
#: ``send_all`` per line caps near 90 k lines/s on the socket).
WRITE_BATCH_BYTES: Final = 64 * 1024
#: After the other side finishes sending, requests already read get this long to be answered
#: before the connection ends: a client may pipe requests and close its input at once. Short,
#: because for most clients end of input means they are gone, and the edge releases a
#: connection's leases only once this is over (their capabilities go at end of input: no
#: permission can be granted meanwhile, our own requests fail at once).
EOF_GRACE_S: Final = 1.0


class JsonRpcPeer:
    """A JSON-RPC 2.0 peer over one transport (a ``trio.abc.Stream``, framed in lines, or a
    :class:`~maple_acp.rpc.MessageTransport`), both directions. What it sends takes a ``route``
    (the session a message is about); an answer takes its request's route.

    Inbound requests go to ``on_request(method, params)``, each in its own task; its return
    value is the result, a :class:`ProtocolError` it raises is the error answer, and any other
    exception is answered ``-32603`` with a generic message (the traceback goes to the log,
    never to the wire). Inbound notifications go to ``on_notification(method, params)``, awaited
    in the reader task so that they are handled in arrival order: it must return promptly.
    ``$/cancel_request`` is handled here and never reaches ``on_notification``.

    With ``order_key``, requests are *admitted* in arrival order: the reader gives each
    request its key as it reads it (``order_key(method, params)``, see ``rpc._admission``;
    it must not raise), and a handler starts only once every earlier request with a
    conflicting key has been admitted, which it is when its handler calls :func:`admitted`
    or ends. A notification handler orders an action the same way with :meth:`in_order`.

    When the other side finishes sending, ``on_eof`` (if given) is called at once, and the
    requests already read get ``eof_grace`` seconds to be answered before the connection ends.

    Every outbound line takes credit from one :class:`OutboundCredit` before it is queued and
    gives it back once written, so a reader that stops reading makes senders wait. The reading
    task itself never waits for credit: the replies it owes (a parse error, a refused request)
    take the shared credit when it is free at once, else a small reserve of their own.
    """

    def __init__(
        self,
        stream: trio.abc.Stream | MessageTransport,
        *,
        on_request: RequestHandler | None = None,
        on_notification: NotificationHandler | None = None,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_outbound_lines: int = MAX_OUTBOUND_LINES,
        max_outbound_bytes: int = MAX_OUTBOUND_BYTES,
        max_concurrent_requests: int = MAX_CONCURRENT_REQUESTS,
        eof_grace: float = EOF_GRACE_S,
        on_eof: Callable[[], None] | None = None,
        order_key: OrderKey | None = None,
    ) -> None:
        self._transport = as_transport(stream, max_line_bytes=max_line_bytes)
        # A message transport's messages are held to the frame cap here.
        self._message_cap = None if self._transport.frames_inbound else max_line_bytes
        self._on_notification = on_notification
        self._flow = OutboundFlow(max_lines=max_outbound_lines, max_bytes=max_outbound_bytes)
        # The flow's credit and waiting line, read by the streaming path without a hop.
        self._credit = self._flow.credit
        self._credit_waiters = self._flow.waiters
        self._pending: PendingRequests[OutgoingCall] = PendingRequests()
        self._requests = InboundRequests(
            on_request=on_request,
            order_key=order_key,
            max_concurrent=max_concurrent_requests,
            send=self._send,
            closed=lambda: self._closed,
        )
        # (line, credit to give back once written: 0 when the sender holds it, negative when
        # it is the reply reserve's, the line's route)
        self._outbox: deque[tuple[bytes, int, Route]] = deque()
        self._writer_lot = trio.lowlevel.ParkingLot()
        self._writer_parked = False
        self._queued = 0
        self._written = 0
        self._drain_waiters: deque[tuple[int, trio.Event]] = deque()
        self._scope: trio.CancelScope | None = None
        self._serving = False
        self._finished = trio.Event()
        self._closed = False
        self._close_reason = ""
        self._frames_received = 0
        #: Whether a top-level array is a JSON-RPC batch (ACP v2) rather than a fault.
        self.accept_batches = False
        self._eof_grace = eof_grace
        self._on_eof = on_eof
        self._faults = PeerFaults()

    # --- state ------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def close_reason(self) -> str:
        """Why the connection ended; empty while it is open."""
        return self._close_reason

    @property
    def frames_received(self) -> int:
        """Inbound lines dispatched so far, the current one included (a handler can tell
        whether its message was the first frame of the connection)."""
        return self._frames_received

    @property
    def credit(self) -> OutboundCredit:
        """The outbound budget (read it; do not acquire from it directly)."""
        return self._credit

    # --- lifetime ---------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the reader and the writer until the connection ends.

        Reports ready (``task_status.started()``) once both are running; inbound request
        handlers run as tasks in the same nursery. Returns when the other side closes its end,
        the transport fails, an inbound line exceeds the cap, or :meth:`aclose` is called.

        Resource handling: owns the transport from the moment it starts and closes it before
        returning. When the connection ends, in-flight request handlers are cancelled without
        an answer (there is nobody left to read it), lines still queued are dropped, every
        outgoing request still waiting fails at once with :class:`ConnectionClosed`, and so do
        :meth:`notify`, :meth:`drain` and :meth:`request` calls waiting on credit or output.
        No task outlives this call.

        Error handling: EOF, ``trio.BrokenResourceError`` and ``trio.ClosedResourceError`` from
        the transport end the connection normally. A line longer than ``max_line_bytes`` ends it
        with a warning in the log and no answer. Malformed messages are answered (``-32700`` /
        ``-32600``) and the connection goes on; the reading task queues such replies without
        waiting (the shared credit if free now, else the reply reserve), so a full outbound
        queue never stops it from reading the answers that would free that queue. When both
        are spent the other side keeps sending faults without reading the replies, and the
        connection ends with a warning. A handler's exception becomes a ``-32603``
        answer and is logged with its traceback; an ``on_notification`` exception is logged.
        Nothing of these propagates; a bug in this class does.
        """
        if self._serving:
            raise RuntimeError("serve() can run only once per peer")
        self._serving = True
        try:
            if self._closed:
                task_status.started()
                return
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                nursery.start_soon(self._write_loop)
                nursery.start_soon(self._read_loop, nursery)
                task_status.started()
        finally:
            self._end("the connection was shut down")
            await trio.aclose_forcefully(self._transport)
            self._finished.set()

    async def aclose(self) -> None:
        """End the connection and wait until :meth:`serve` has finished (or close the
        transport if it never ran). Idempotent."""
        self._end("closed locally")
        if self._serving:
            await self._finished.wait()
        else:
            await trio.aclose_forcefully(self._transport)

    def _end(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        logger.debug("connection ended: %s", reason)
        for call in self._pending.pop_all():
            call.finish(error=ConnectionClosed(reason))
        self._flow.close()
        while self._drain_waiters:
            self._drain_waiters.popleft()[1].set()
        self._outbox.clear()
        if self._scope is not None:
            self._scope.cancel()

    # --- sending ----------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        params: Any = None,
        *,
        hold_credit: bool = False,
        cancel_remote: bool = False,
        route: Route = None,
    ) -> Any:
        """Send a request and return its result (``None`` for ``result: null``).

        ``params`` is anything orjson encodes; an ``orjson.Fragment`` carries pre-encoded
        JSON. With ``hold_credit`` the request's outbound credit stays taken until its answer
        arrives, the call is cancelled or the connection ends (a permission request must not
        let more output past it while it is open). With ``cancel_remote``, abandoning the call
        also tells the other side with ``$/cancel_request``; that notice is queued at once,
        without waiting for credit, because the caller is being cancelled and cannot wait.

        Resource handling: the request's id stays in the pending table only while this call
        waits; cancelling the caller abandons the request (the id is forgotten, a late answer
        is dropped with a debug log, held credit is given back). Nothing is sent to the other
        side on cancellation unless ``cancel_remote`` is set.

        Error handling: raises :class:`ProtocolError` for an error answer (and for a malformed
        answer to this id), :class:`ConnectionClosed` if the connection ends first (every
        waiting request fails at that moment), :class:`OutboundFrameTooLarge` if the request
        alone exceeds the outbound budget, and orjson's ``TypeError`` if ``params`` cannot be
        encoded. Nothing is retried.
        """
        msg_id = self._pending.allocate_id()
        line = encode_request(msg_id, method, params)
        charge = await self._acquire(len(line))
        call = OutgoingCall()
        self._pending.add(msg_id, call)
        self._enqueue(line, 0 if hold_credit else charge, route)
        try:
            await call.done.wait()
        finally:
            if self._pending.pop(msg_id) is not None:
                logger.debug("abandoned outgoing request %d (%s)", msg_id, method)
                if cancel_remote and not self._closed:
                    notice = encode_notification(CANCEL_REQUEST_METHOD, {"requestId": msg_id})
                    self._enqueue(notice, 0, route)
            if hold_credit:
                self._flow.release(charge)
        if call.error is not None:
            raise call.error
        return call.result

    async def notify(self, method: str, params: Any = None, *, route: Route = None) -> None:
        """Queue a notification, waiting for outbound credit if the budget is spent.

        Returns once the line is queued, not written (see :meth:`drain`). While credit is
        available it does not yield to the scheduler, so a producer streaming many lines pays
        no scheduler pass per line; it still raises ``trio.Cancelled`` when cancelled.
        Raises :class:`ConnectionClosed` and :class:`OutboundFrameTooLarge` like :meth:`request`.
        """
        await self._send(encode_notification(method, params), route)

    async def notify_encoded(self, line: bytes, route: Route = None) -> None:
        """:meth:`notify` for a complete, pre-encoded message line ending in one ``\\n``.

        ``ValueError`` if the line is empty or has a newline anywhere but at its end.
        """
        # The streaming hot path (one call per text chunk): the frame check, the credit and
        # the hand-off are inlined rather than calls, with the same rules as _send; ``route``
        # is not keyword-only, as a keyword-only default costs every call a slower path.
        size = len(line)
        if not size or line.find(b"\n") != size - 1:
            check_frame(line)  # raises the precise ValueError
        charge = size + FRAME_OVERHEAD_BYTES
        if self._closed:
            raise ConnectionClosed(self._close_reason)
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._credit_waiters or not self._credit.try_acquire(charge):
            await self._wait_for_credit(charge)
        self._outbox.append((line, charge, route))
        self._queued += 1
        if self._writer_parked:
            self._writer_parked = False
            self._writer_lot.unpark()

    async def notify_lines(self, lines: Sequence[bytes], route: Route = None) -> None:
        """:meth:`notify_encoded` for many lines, in order, as one hand-off: one cancellation
        check and one writer wake-up for the batch, its credit taken at once when it all fits
        (else line by line: what is queued goes to the writer first, then this waits).

        ``ValueError`` (before anything is queued) if a line is empty or has a newline
        anywhere but at its end. Raises like :meth:`notify` otherwise; on cancellation the
        lines already queued stay queued and the rest are not."""
        queued = [(line, len(line) + FRAME_OVERHEAD_BYTES, route) for line in lines]
        total = 0
        for line, charge, _ in queued:
            if not line or line.find(b"\n") != charge - FRAME_OVERHEAD_BYTES - 1:
                check_frame(line)  # raises the precise ValueError
            total += charge
        if self._closed:
            raise ConnectionClosed(self._close_reason)
        await trio.lowlevel.checkpoint_if_cancelled()
        credit = self._credit
        if not self._credit_waiters and credit.try_acquire_many(len(queued), total):
            self._outbox.extend(queued)
            self._queued += len(queued)
            self._wake_writer()
            return
        outbox = self._outbox
        try:
            for entry in queued:
                if self._credit_waiters or not credit.try_acquire(entry[1]):
                    self._wake_writer()
                    await self._wait_for_credit(entry[1])
                outbox.append(entry)
                self._queued += 1
        finally:
            self._wake_writer()

    async def drain(self) -> None:
        """Return once every line queued before this call has been fully written.

        Lines still waiting for credit in other tasks are not queued yet and are not waited
        for. Raises :class:`ConnectionClosed` if the connection ends first.
        """
        target = self._queued
        if self._written >= target:
            await trio.lowlevel.checkpoint()
            return
        if self._closed:
            raise ConnectionClosed(self._close_reason)
        event = trio.Event()
        self._drain_waiters.append((target, event))
        await event.wait()
        if self._written < target:
            raise ConnectionClosed(self._close_reason)

    async def _send(self, line: bytes, route: Route = None) -> None:
        self._enqueue(line, await self._acquire(len(line)), route)

    async def _acquire(self, size: int) -> int:
        # The streaming hot path: no scheduler pass while credit is available.
        charge = OutboundCredit.charge_for(size)
        if self._closed:
            raise ConnectionClosed(self._close_reason)
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._credit_waiters or not self._credit.try_acquire(charge):
            await self._wait_for_credit(charge)
        return charge

    async def _wait_for_credit(self, charge: int) -> None:
        if not await self._flow.wait(charge):
            raise ConnectionClosed(self._close_reason)

    def _enqueue(self, line: bytes, release_charge: int, route: Route) -> None:
        self._outbox.append((line, release_charge, route))
        self._queued += 1
        self._wake_writer()

    def _wake_writer(self) -> None:
        if self._writer_parked and self._outbox:
            # Cleared here, not when the writer resumes: one wake-up per batch, not per line.
            self._writer_parked = False
            self._writer_lot.unpark()

    async def _write_loop(self) -> None:
        outbox = self._outbox
        popleft = outbox.popleft
        send = self._transport.send
        flow = self._flow
        try:
            while True:
                if not outbox:
                    self._writer_parked = True
                    await self._writer_lot.park()
                    continue
                lines: list[bytes] = []
                routes: list[Route] = []
                size = 0
                released_bytes = 0
                released_lines = 0
                reserve_bytes = 0
                reserve_lines = 0
                while outbox and size < WRITE_BATCH_BYTES:
                    line, charge, route = popleft()
                    lines.append(line)
                    routes.append(route)
                    size += len(line)
                    if charge > 0:
                        released_bytes += charge
                        released_lines += 1
                    elif charge:
                        reserve_bytes -= charge
                        reserve_lines += 1
                await send(lines, routes)
                self._written += len(lines)
                flow.written((released_bytes, released_lines), (reserve_bytes, reserve_lines))
                drain_waiters = self._drain_waiters
                while drain_waiters and drain_waiters[0][0] <= self._written:
                    drain_waiters.popleft()[1].set()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._end(went_away("writing", exc))

    # --- receiving --------------------------------------------------------------------------

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        reason = "the other side closed the connection"
        receive = self._transport.receive
        cap = self._message_cap
        try:
            while True:
                try:
                    received = await receive()
                    if received is None:
                        await self._answer_after_eof()
                        break
                    lines, route = received
                    if cap is not None:
                        lines = capped(lines, cap)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    reason = went_away("reading", exc)
                    break
                except FrameTooLong as exc:
                    logger.warning("closing the connection: %s", exc)
                    reason = str(exc)
                    break
                for line in lines:
                    await self._dispatch(line, nursery, route)
        except ConnectionClosed:
            pass
        self._end(reason)

    async def _answer_after_eof(self) -> None:
        """The other side has finished sending but may still read (a half-close, or a pipe
        whose writer ended): requests already read still get their answers, within
        ``eof_grace``. Nothing can answer our own requests any more, so they fail at once."""
        for call in self._pending.pop_all():
            call.finish(error=ConnectionClosed("the other side finished sending"))
        if self._on_eof is not None:
            self._on_eof()
        with trio.move_on_after(self._eof_grace):
            await self._requests.wait_for_handlers()
            await self.drain()

    async def _dispatch(self, line: bytes, nursery: trio.Nursery, route: Route) -> None:
        if self.accept_batches:
            members = split_batch(line)
            if isinstance(members, list):
                # Each member is a frame of its own (the same limits, the same order); the
                # batch is answered as one array once every request in it is answered.
                batch = BatchAnswer(route)
                for member in members:
                    self._frames_received += 1
                    await self._dispatch_message(member, nursery, batch, route)
                batch.sealed = True
                if batch.complete:
                    self._finish_batch_now(batch, nursery)
                return
            if members is not None:
                self._frames_received += 1
                self._refuse(members, None, route)
                return
        self._frames_received += 1
        await self._dispatch_message(parse_message(line), nursery, None, route)

    def _refuse(self, message: InvalidMessage, batch: BatchAnswer | None, route: Route) -> None:
        reply = message.reply
        self._faults.log(
            ("malformed", reply.code), f"answering a malformed message: {reply.message}"
        )
        if message.response_id is not None:
            call = self._pending.pop(message.response_id)
            if call is not None:
                call.finish(error=reply.to_exception())
        self._reply(encode_error(reply.id, reply.to_exception()), reply.id, batch, route)

    def _reply(
        self, line: bytes, msg_id: RequestId, batch: BatchAnswer | None, route: Route
    ) -> None:
        """A reply the reader owes: queued at once, or put in its batch's answer."""
        if batch is None:
            self._queue_reply(line, route)
        else:
            batch.fill(batch.slot(msg_id), line)

    async def _dispatch_message(
        self, message: Parsed, nursery: trio.Nursery, batch: BatchAnswer | None, route: Route
    ) -> None:
        if isinstance(message, Notification):
            await self._handle_notification(message)
        elif isinstance(message, Request):
            refusal = self._requests.start(message, self._frames_received, nursery, batch, route)
            if refusal is not None:
                self._reply(refusal, message.id, batch, route)
        elif isinstance(message, Response):
            call = self._pending.pop(message.id)
            if call is None:
                logger.debug("dropping an answer for unknown or abandoned id %r", message.id)
            else:
                call.finish(result=message.result)
        elif isinstance(message, ErrorResponse):
            if message.id is None:
                # An error answer to one of our notifications (a client that does not know an
                # update kind, say): told once per connection and code.
                self._faults.log(
                    ("error answer", message.code),
                    f"the other side answered a notification with error {message.code}: "
                    f"{message.message}",
                )
                return
            call = self._pending.pop(message.id)
            if call is None:
                logger.debug("dropping an error answer for unknown or abandoned id %r", message.id)
            else:
                call.finish(error=message.to_exception())
        else:
            self._refuse(message, batch, route)

    def _finish_batch_now(self, batch: BatchAnswer, nursery: trio.Nursery) -> None:
        """Queue a batch answer complete when the reader sealed it: without waiting when only
        the reader's refusals are in it, else from a task (a handler's answer may be large;
        the reader never waits for credit)."""
        if batch.handled:
            nursery.start_soon(self._requests.send_batch, batch)
        else:
            self._queue_reply(batch.encode(), batch.route)
            batch.sent.set()

    def _queue_reply(self, line: bytes, route: Route) -> None:
        """Queue a reply the reading task owes, without waiting: the shared credit if it is
        free now and no sender waits for it, else the reply reserve.

        Error handling: when neither has room, the other side keeps sending faults while it
        does not read the replies (or one reply alone exceeds both): the connection ends with
        a warning, and :class:`ConnectionClosed` stops the reader.
        """
        if self._closed:
            raise ConnectionClosed(self._close_reason)
        charge = self._flow.take_reply(OutboundCredit.charge_for(len(line)))
        if charge is not None:
            self._enqueue(line, charge, route)
        else:
            reason = "the other side sends faulty messages without reading their replies"
            logger.warning("closing the connection: %s", reason)
            self._end(reason)
            raise ConnectionClosed(reason)

    async def _handle_notification(self, message: Notification) -> None:
        if message.method == CANCEL_REQUEST_METHOD:
            self._requests.cancel(message.params)
            return
        if self._on_notification is None:
            logger.debug("ignoring notification %r", message.method)
            return
        try:
            await self._on_notification(message.method, message.params)
        except ProtocolError as exc:
            logger.debug("notification %r refused: %s", message.method, exc.message)
        except Exception:
            logger.exception("notification handler for %r failed", message.method)

    # --- admission order ----------------------------------------------------------------------

    @property
    def held_actions(self) -> int:
        """Notification actions :meth:`in_order` holds back for now."""
        return self._requests.admission.deferred

    def in_order(self, key: Hashable | None, callback: Callable[[], None]) -> None:
        """In a notification handler: run ``callback`` once every request read before this
        notification whose key conflicts with ``key`` has been admitted: now, or later from
        the task that admits the last of them (it must be quick and must not raise). Each
        held action is kept until then: the caller bounds how many it holds (one per key,
        say, as a later action can stand for an earlier one)."""
        self._requests.admission.in_order(self._frames_received, key, callback)
