"""The Trio shell: one reader, one writer and one task per inbound request over a Stream;
requests decided in arrival order (``_admission``), a batch's members in one answer.

Everything with a rule in it (framing, envelopes, credit, id correlation) lives in the sans-I/O
modules beside this one; this module only moves bytes and wakes tasks: the reader, the
writer and the request tasks of one connection, whose wake-ups depend on each other's state.
"""

from __future__ import annotations

import contextvars
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from functools import partial
from typing import Any, Final, TypeAlias

import trio

from maple_acp._groups import single_exception
from maple_acp.wire.errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_CANCELLED,
    ProtocolError,
)

from ._admission import AdmissionOrder
from ._credit import (
    FRAME_OVERHEAD_BYTES,
    MAX_OUTBOUND_BYTES,
    MAX_OUTBOUND_LINES,
    REPLY_RESERVE_BYTES,
    REPLY_RESERVE_LINES,
    OutboundCredit,
)
from ._envelope import (
    ErrorResponse,
    InvalidMessage,
    Notification,
    Params,
    Parsed,
    Request,
    RequestId,
    Response,
    check_frame,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
    parse_message,
    split_batch,
)
from ._exceptions import ConnectionClosed, FrameTooLong, OutboundFrameTooLarge
from ._framing import MAX_LINE_BYTES, LineFramer
from ._pending import PendingRequests

logger = logging.getLogger(__name__)

#: Bytes asked of the transport per read (reads above 128 KiB pay an mmap each).
READ_CHUNK_BYTES: Final = 64 * 1024
#: The writer joins queued lines up to about this size into one ``send_all`` (one
#: ``send_all`` per line caps near 90 k lines/s).
WRITE_BATCH_BYTES: Final = 64 * 1024
#: Inbound requests handled at once; each holds a task, so a client that floods requests and
#: never reads its answers cannot grow them without bound. One more is refused ``-32600``
#: naming this limit: the client's doing, which it can fix by waiting for answers.
MAX_CONCURRENT_REQUESTS: Final = 256
#: After the other side finishes sending, requests already read get this long to be answered
#: before the connection ends: a client may pipe requests and close its input at once. Short,
#: because for most clients end of input means they are gone, and the edge releases a
#: connection's leases only once this is over (their capabilities go at end of input: no
#: permission can be granted meanwhile, our own requests fail at once).
EOF_GRACE_S: Final = 1.0
#: The notification that cancels one in-flight inbound request (ACP ``$/cancel_request``).
CANCEL_REQUEST_METHOD: Final = "$/cancel_request"
#: A line about the other side's fault is cut to this (its own text may be long: one client
#: answers every update it does not know with 500 characters), so that with the log prefix it
#: stays within 200.
MAX_PEER_FAULT_CHARS: Final = 160
#: Kinds of fault told at INFO once each per connection; past this many, all go to DEBUG (a
#: client choosing error codes cannot grow the set).
MAX_PEER_FAULT_KINDS: Final = 16

#: The inbound frame index (see ``JsonRpcPeer.frames_received``) of the request whose handler
#: is running in the current task.
_ARRIVAL: contextvars.ContextVar[int] = contextvars.ContextVar("maple_acp_rpc_arrival", default=0)


#: Sends a request handler asked to make once its answer is queued (see :func:`after_answer`).
_FOLLOW_UPS: contextvars.ContextVar[list[Callable[[], Awaitable[None]]] | None] = (
    contextvars.ContextVar("maple_acp_rpc_follow_ups", default=None)
)


def after_answer(send: Callable[[], Awaitable[None]]) -> None:
    """In a request handler: call ``send`` in the request's task right after its (successful)
    answer is queued, for messages the other side must not see before the answer (updates
    about a session whose id the answer carries). Not called if the handler fails."""
    follow_ups = _FOLLOW_UPS.get()
    if follow_ups is None:
        raise RuntimeError("after_answer() is for request handlers")
    follow_ups.append(send)


#: Marks the current request handler's request admitted (see :func:`admitted`).
_ADMIT: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "maple_acp_rpc_admit", default=None
)


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


RequestHandler: TypeAlias = Callable[[str, Params], Awaitable[Any]]
#: A request's ordering key from its method and params (see ``rpc._admission``).
OrderKey: TypeAlias = Callable[[str, Params], Hashable | None]
NotificationHandler: TypeAlias = Callable[[str, Params], Awaitable[None]]


def method_not_found(method: str) -> ProtocolError:
    """The error a request handler raises for a method it does not implement."""
    return ProtocolError(METHOD_NOT_FOUND, f"method not found: {method}")


def _unwrap_protocol_error(exc: BaseException) -> ProtocolError | None:
    # A handler that raises ProtocolError from inside its own nursery surfaces it wrapped in
    # an exception group; the answer should still carry that error.
    exc = single_exception(exc)
    return exc if isinstance(exc, ProtocolError) else None


class _Call:
    """One outgoing request waiting for its answer."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result = result
        self.error = error
        self.done.set()


def _try_take(credit: OutboundCredit, charge: int) -> bool:
    """Take ``charge`` from ``credit`` if it fits now; a charge it could never hold is no."""
    try:
        return credit.try_acquire(charge)
    except OutboundFrameTooLarge:
        return False


class _CreditWaiter:
    __slots__ = ("charge", "event", "granted")

    def __init__(self, charge: int) -> None:
        self.charge = charge
        self.event = trio.Event()
        self.granted = False


class _BatchAnswer:
    """The one answer of a JSON-RPC batch: an answer per request member (and per malformed
    member), in member order, sent as one array once the batch is read whole (``sealed``)
    and every slot is filled. A batch of notifications and answers only is answered with
    nothing at all (JSON-RPC 2.0, section 6)."""

    __slots__ = ("handled", "ids", "lines", "missing", "sealed", "sent")

    def __init__(self) -> None:
        self.ids: list[RequestId] = []
        self.lines: list[bytes] = []
        self.missing = 0
        self.sealed = False
        #: Whether a handler's answer is in it (else only the reader's refusals are).
        self.handled = False
        #: Set once the array is queued (or never will be): members' follow-ups wait for it.
        self.sent = trio.Event()

    def slot(self, msg_id: RequestId) -> int:
        self.ids.append(msg_id)
        self.lines.append(b"")
        self.missing += 1
        return len(self.lines) - 1

    def fill(self, index: int, line: bytes) -> bool:
        """Put one member's answer line in; True if that completed a sealed batch."""
        self.lines[index] = line
        self.missing -= 1
        return self.complete

    @property
    def complete(self) -> bool:
        return self.sealed and self.missing == 0 and bool(self.lines)

    def encode(self) -> bytes:
        # Each answer is one line ending in its newline: the array joins them without it.
        return b"[" + b",".join(line[:-1] for line in self.lines) + b"]\n"

    def shrink(self, error: ProtocolError) -> bool:
        """Replace the largest answer still larger than ``error`` would be by it; False if
        none is left."""
        replacements = [encode_error(msg_id, error) for msg_id in self.ids]
        larger = [i for i, line in enumerate(self.lines) if len(line) > len(replacements[i])]
        if not larger:
            return False
        largest = max(larger, key=lambda i: len(self.lines[i]))
        self.lines[largest] = replacements[largest]
        return True


class JsonRpcPeer:
    """A newline-delimited JSON-RPC 2.0 peer over one ``trio.abc.Stream``, both directions.

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
        stream: trio.abc.Stream,
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
        if not 1 <= max_concurrent_requests <= MAX_CONCURRENT_REQUESTS:
            raise ValueError(f"max_concurrent_requests must be in 1..{MAX_CONCURRENT_REQUESTS}")
        self._stream = stream
        self._on_request = on_request
        self._on_notification = on_notification
        self._framer = LineFramer(max_line_bytes=max_line_bytes)
        self._credit = OutboundCredit(max_lines=max_outbound_lines, max_bytes=max_outbound_bytes)
        self._credit_waiters: deque[_CreditWaiter] = deque()
        self._reply_reserve = OutboundCredit(
            max_lines=REPLY_RESERVE_LINES, max_bytes=REPLY_RESERVE_BYTES
        )
        self._pending: PendingRequests[_Call] = PendingRequests()
        self._max_concurrent = max_concurrent_requests
        self._inflight: dict[RequestId, trio.CancelScope] = {}
        self._order_key = order_key
        self._order = AdmissionOrder()
        #: Handlers waiting for their turn to decide, by ticket (their arrival).
        self._admission_waiters: dict[int, trio.Event] = {}
        # (line, credit to give back once written: 0 when the sender holds it, negative when
        # it is the reply reserve's)
        self._outbox: deque[tuple[bytes, int]] = deque()
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
        # Request handler tasks still running (answer not yet queued), for the EOF grace.
        self._handlers = 0
        self._handlers_done = trio.Event()
        #: The kinds of the other side's faults already told at INFO on this connection.
        self._peer_faults: set[object] = set()

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

        Resource handling: owns the stream from the moment it starts and closes it before
        returning. When the connection ends, in-flight request handlers are cancelled without
        an answer (there is nobody left to read it), lines still queued are dropped, every
        outgoing request still waiting fails at once with :class:`ConnectionClosed`, and so do
        :meth:`notify`, :meth:`drain` and :meth:`request` calls waiting on credit or output.
        No task outlives this call.

        Error handling: EOF, ``trio.BrokenResourceError`` and ``trio.ClosedResourceError`` from
        the stream end the connection normally. A line longer than ``max_line_bytes`` ends it
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
            await trio.aclose_forcefully(self._stream)
            self._finished.set()

    async def aclose(self) -> None:
        """End the connection and wait until :meth:`serve` has finished (or close the stream
        if it never ran). Idempotent."""
        self._end("closed locally")
        if self._serving:
            await self._finished.wait()
        else:
            await trio.aclose_forcefully(self._stream)

    def _end(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        logger.debug("connection ended: %s", reason)
        for call in self._pending.pop_all():
            call.finish(error=ConnectionClosed(reason))
        while self._credit_waiters:
            self._credit_waiters.popleft().event.set()
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
        call = _Call()
        self._pending.add(msg_id, call)
        self._enqueue(line, 0 if hold_credit else charge)
        try:
            await call.done.wait()
        finally:
            if self._pending.pop(msg_id) is not None:
                logger.debug("abandoned outgoing request %d (%s)", msg_id, method)
                if cancel_remote and not self._closed:
                    notice = encode_notification(CANCEL_REQUEST_METHOD, {"requestId": msg_id})
                    self._enqueue(notice, 0)
            if hold_credit:
                self._release(charge)
        if call.error is not None:
            raise call.error
        return call.result

    async def notify(self, method: str, params: Any = None) -> None:
        """Queue a notification, waiting for outbound credit if the budget is spent.

        Returns once the line is queued, not written (see :meth:`drain`). While credit is
        available it does not yield to the scheduler, so a producer streaming many lines pays
        no scheduler pass per line; it still raises ``trio.Cancelled`` when cancelled.
        Raises :class:`ConnectionClosed` and :class:`OutboundFrameTooLarge` like :meth:`request`.
        """
        await self._send(encode_notification(method, params))

    async def notify_encoded(self, line: bytes) -> None:
        """:meth:`notify` for a complete, pre-encoded message line ending in one ``\\n``.

        ``ValueError`` if the line is empty or has a newline anywhere but at its end.
        """
        # The streaming hot path (one call per text chunk): the frame check, the credit and
        # the hand-off are inlined rather than calls, with the same rules as _send.
        size = len(line)
        if not size or line.find(b"\n") != size - 1:
            check_frame(line)  # raises the precise ValueError
        charge = size + FRAME_OVERHEAD_BYTES
        if self._closed:
            raise ConnectionClosed(self._close_reason)
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._credit_waiters or not self._credit.try_acquire(charge):
            await self._wait_for_credit(charge)
        self._outbox.append((line, charge))
        self._queued += 1
        if self._writer_parked:
            self._writer_parked = False
            self._writer_lot.unpark()

    async def notify_lines(self, lines: Sequence[bytes]) -> None:
        """:meth:`notify_encoded` for many lines, in order, as one hand-off: one cancellation
        check and one writer wake-up for the batch, its credit taken at once when it all fits
        (else line by line: what is queued goes to the writer first, then this waits).

        ``ValueError`` (before anything is queued) if a line is empty or has a newline
        anywhere but at its end. Raises like :meth:`notify` otherwise; on cancellation the
        lines already queued stay queued and the rest are not."""
        queued = [(line, len(line) + FRAME_OVERHEAD_BYTES) for line in lines]
        total = 0
        for line, charge in queued:
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

    async def _send(self, line: bytes) -> None:
        self._enqueue(line, await self._acquire(len(line)))

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
        self._credit.check_admissible(charge)
        waiter = _CreditWaiter(charge)
        self._credit_waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:
                self._release(charge)
            elif not waiter.event.is_set():
                # (When the event is set without a grant, the connection ended and emptied the
                # queue while this sender was being cancelled: nothing to remove or hand on.)
                self._credit_waiters.remove(waiter)
                self._grant_waiters()
            raise
        if not waiter.granted:
            raise ConnectionClosed(self._close_reason)

    def _release(self, charge: int) -> None:
        self._credit.release(charge)
        if self._credit_waiters:
            self._grant_waiters()

    def _grant_waiters(self) -> None:
        # Strict FIFO: a large frame at the head is not starved by small ones behind it.
        waiters = self._credit_waiters
        while waiters and self._credit.try_acquire(waiters[0].charge):
            waiter = waiters.popleft()
            waiter.granted = True
            waiter.event.set()

    def _enqueue(self, line: bytes, release_charge: int) -> None:
        self._outbox.append((line, release_charge))
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
        send_all = self._stream.send_all
        credit = self._credit
        try:
            while True:
                if not outbox:
                    self._writer_parked = True
                    await self._writer_lot.park()
                    continue
                lines: list[bytes] = []
                size = 0
                released_bytes = 0
                released_lines = 0
                reserve_bytes = 0
                reserve_lines = 0
                while outbox and size < WRITE_BATCH_BYTES:
                    line, charge = popleft()
                    lines.append(line)
                    size += len(line)
                    if charge > 0:
                        released_bytes += charge
                        released_lines += 1
                    elif charge:
                        reserve_bytes -= charge
                        reserve_lines += 1
                await send_all(lines[0] if len(lines) == 1 else b"".join(lines))
                self._written += len(lines)
                if released_lines:
                    credit.release(released_bytes, released_lines)
                if reserve_lines:
                    self._reply_reserve.release(reserve_bytes, reserve_lines)
                if self._credit_waiters:
                    self._grant_waiters()
                drain_waiters = self._drain_waiters
                while drain_waiters and drain_waiters[0][0] <= self._written:
                    drain_waiters.popleft()[1].set()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._end(f"the transport failed while writing: {exc!r}")

    # --- receiving --------------------------------------------------------------------------

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        reason = "the other side closed the connection"
        try:
            while True:
                try:
                    data = await self._stream.receive_some(READ_CHUNK_BYTES)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    reason = f"the transport failed while reading: {exc!r}"
                    break
                if not data:
                    last = self._framer.feed_eof()
                    if last is not None:
                        await self._dispatch(last, nursery)
                    await self._answer_after_eof()
                    break
                try:
                    lines = self._framer.feed(data if type(data) is bytes else bytes(data))
                except FrameTooLong as exc:
                    logger.warning("closing the connection: %s", exc)
                    reason = str(exc)
                    break
                for line in lines:
                    await self._dispatch(line, nursery)
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
            while self._handlers:
                await self._handlers_done.wait()
            await self.drain()

    async def _dispatch(self, line: bytes, nursery: trio.Nursery) -> None:
        if self.accept_batches:
            members = split_batch(line)
            if isinstance(members, list):
                # Each member is a frame of its own (the same limits, the same order); the
                # batch is answered as one array once every request in it is answered.
                batch = _BatchAnswer()
                for member in members:
                    self._frames_received += 1
                    await self._dispatch_message(member, nursery, batch)
                batch.sealed = True
                if batch.complete:
                    self._finish_batch_now(batch, nursery)
                return
            if members is not None:
                self._frames_received += 1
                self._refuse(members)
                return
        self._frames_received += 1
        await self._dispatch_message(parse_message(line), nursery, None)

    def _refuse(self, message: InvalidMessage, batch: _BatchAnswer | None = None) -> None:
        reply = message.reply
        self._log_peer_fault(
            ("malformed", reply.code), f"answering a malformed message: {reply.message}"
        )
        if message.response_id is not None:
            call = self._pending.pop(message.response_id)
            if call is not None:
                call.finish(error=reply.to_exception())
        self._reply(encode_error(reply.id, reply.to_exception()), reply.id, batch)

    def _reply(self, line: bytes, msg_id: RequestId, batch: _BatchAnswer | None) -> None:
        """A reply the reader owes: queued at once, or put in its batch's answer."""
        if batch is None:
            self._queue_reply(line)
        else:
            batch.fill(batch.slot(msg_id), line)

    async def _dispatch_message(
        self, message: Parsed, nursery: trio.Nursery, batch: _BatchAnswer | None
    ) -> None:
        if isinstance(message, Notification):
            await self._handle_notification(message)
        elif isinstance(message, Request):
            self._start_request(message, nursery, batch)
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
                self._log_peer_fault(
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
            self._refuse(message, batch)

    def _finish_batch_now(self, batch: _BatchAnswer, nursery: trio.Nursery) -> None:
        """Queue a batch answer complete when the reader sealed it: without waiting when only
        the reader's refusals are in it, else from a task (a handler's answer may be large;
        the reader never waits for credit)."""
        if batch.handled:
            nursery.start_soon(self._send_batch, batch)
        else:
            self._queue_reply(batch.encode())
            batch.sent.set()

    async def _send_batch(self, batch: _BatchAnswer) -> None:
        """Queue a batch's one answer; its members' follow-ups wait for this. An array too
        large for the outbound budget has its largest answers replaced by ``-32603``
        ("answer too large") until it fits."""
        try:
            while True:
                try:
                    await self._send(batch.encode())
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

    def _queue_reply(self, line: bytes) -> None:
        """Queue a reply the reading task owes, without waiting: the shared credit if it is
        free now and no sender waits for it, else the reply reserve.

        Error handling: when neither has room, the other side keeps sending faults while it
        does not read the replies (or one reply alone exceeds both): the connection ends with
        a warning, and :class:`ConnectionClosed` stops the reader.
        """
        if self._closed:
            raise ConnectionClosed(self._close_reason)
        charge = OutboundCredit.charge_for(len(line))
        if not self._credit_waiters and _try_take(self._credit, charge):
            self._enqueue(line, charge)
        elif _try_take(self._reply_reserve, charge):
            self._enqueue(line, -charge)
        else:
            reason = "the other side sends faulty messages without reading their replies"
            logger.warning("closing the connection: %s", reason)
            self._end(reason)
            raise ConnectionClosed(reason)

    def _log_peer_fault(self, kind: object, text: str) -> None:
        """One line (at most ``MAX_PEER_FAULT_CHARS``) about the other side's fault: the first
        of each kind on this connection is worth an operator's attention (INFO); a flood of
        them is not (DEBUG)."""
        faults = self._peer_faults
        first = kind not in faults and len(faults) < MAX_PEER_FAULT_KINDS
        if first:
            faults.add(kind)
        line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
        if len(line) > MAX_PEER_FAULT_CHARS:
            line = line[: MAX_PEER_FAULT_CHARS - 1] + "…"
        logger.log(logging.INFO if first else logging.DEBUG, "%s", line)

    async def _handle_notification(self, message: Notification) -> None:
        if message.method == CANCEL_REQUEST_METHOD:
            self._cancel_inbound(message.params)
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

    def _cancel_inbound(self, params: Params) -> None:
        if type(params) is not dict or "requestId" not in params:
            logger.debug("ignoring a malformed %s", CANCEL_REQUEST_METHOD)
            return
        target = params["requestId"]
        scope = self._inflight.get(target) if type(target) in (int, str, type(None)) else None
        if scope is None:
            logger.debug("%s for %r: no such request in flight", CANCEL_REQUEST_METHOD, target)
            return
        scope.cancel()

    def _start_request(
        self, request: Request, nursery: trio.Nursery, batch: _BatchAnswer | None
    ) -> None:
        if request.id in self._inflight:
            error = ProtocolError(INVALID_REQUEST, "request id is already in use by a request")
            self._reply(encode_error(request.id, error), request.id, batch)
            return
        if len(self._inflight) >= self._max_concurrent:
            error = ProtocolError(
                INVALID_REQUEST,
                f"too many requests in flight: at most {self._max_concurrent} per connection;"
                " wait for an answer, then retry",
            )
            self._reply(encode_error(request.id, error), request.id, batch)
            return
        # Registered before the task starts, so a $/cancel_request later in the same read
        # finds it; a scope cancelled before it is entered cancels the handler at once.
        scope = trio.CancelScope()
        self._inflight[request.id] = scope
        self._handlers += 1
        if self._order_key is not None:
            self._order.enter(
                self._frames_received, self._order_key(request.method, request.params)
            )
        slot = None
        if batch is not None:
            batch.handled = True
            slot = (batch, batch.slot(request.id))
        nursery.start_soon(self._run_request, request, scope, self._frames_received, slot)

    async def _run_request(
        self,
        request: Request,
        scope: trio.CancelScope,
        arrival: int,
        slot: tuple[_BatchAnswer, int] | None,
    ) -> None:
        try:
            await self._handle_request(request, scope, arrival, slot)
        finally:
            self._handlers -= 1
            if self._handlers == 0:
                self._handlers_done.set()
                self._handlers_done = trio.Event()

    async def _handle_request(
        self,
        request: Request,
        scope: trio.CancelScope,
        arrival: int,
        slot: tuple[_BatchAnswer, int] | None,
    ) -> None:
        _ARRIVAL.set(arrival)
        _ADMIT.set(partial(self._admit, arrival))
        follow_ups: list[Callable[[], Awaitable[None]]] = []
        _FOLLOW_UPS.set(follow_ups)
        error: ProtocolError | None = None
        result: Any = None
        returned = False
        try:
            with scope:
                try:
                    if self._on_request is None:
                        raise method_not_found(request.method)
                    if not self._order.ready(arrival):
                        await self._admission_turn(arrival)
                    result = await self._on_request(request.method, request.params)
                    returned = True
                finally:
                    del self._inflight[request.id]
                    self._admit(arrival)
        except Exception as exc:
            if self._closed and isinstance(single_exception(exc), ConnectionClosed):
                # The connection ended under the handler (a client gone mid-stream): a normal
                # end of the request, and there is nobody left to answer.
                logger.debug("%r ended with the connection", request.method)
                return
            error = _unwrap_protocol_error(exc)
            if error is None:
                error = self._internal_error(request.method, exc)
        if error is None and not returned:
            error = ProtocolError(REQUEST_CANCELLED, "request cancelled")
        line = self._encode_answer(request, result, error)
        if slot is not None:
            await self._answer_in_batch(slot, line, follow_ups if error is None else [])
            return
        try:
            try:
                await self._send(line)
            except OutboundFrameTooLarge as exc:
                logger.warning("answer to %r not sent: %s", request.method, exc)
                error = ProtocolError(INTERNAL_ERROR, "internal error (answer too large)")
                await self._send(encode_error(request.id, error))
            if error is None:
                for send in follow_ups:
                    await send()
        except ConnectionClosed:
            logger.debug("answer to %r not sent: the connection ended", request.method)

    async def _answer_in_batch(
        self,
        slot: tuple[_BatchAnswer, int],
        line: bytes,
        follow_ups: list[Callable[[], Awaitable[None]]],
    ) -> None:
        """Put a batch member's answer in the batch's; the last one sends the array. Its
        follow-ups go once the array is queued."""
        batch, index = slot
        if batch.fill(index, line):
            await self._send_batch(batch)
        elif follow_ups:
            await batch.sent.wait()
        if not follow_ups or self._closed:
            return
        try:
            for send in follow_ups:
                await send()
        except ConnectionClosed:
            logger.debug("follow-ups of a batch member not sent: the connection ended")

    # --- admission order ----------------------------------------------------------------------

    async def _admission_turn(self, ticket: int) -> None:
        event = self._admission_waiters[ticket] = trio.Event()
        try:
            await event.wait()
        finally:
            self._admission_waiters.pop(ticket, None)

    def _admit(self, ticket: int) -> None:
        free = self._order.admit(ticket)
        for waiting, event in list(self._admission_waiters.items()):
            if self._order.ready(waiting):
                del self._admission_waiters[waiting]
                event.set()
        for callback in free:
            self._run_ordered(callback)

    @property
    def held_actions(self) -> int:
        """Notification actions :meth:`in_order` holds back for now."""
        return self._order.deferred

    def in_order(self, key: Hashable | None, callback: Callable[[], None]) -> None:
        """In a notification handler: run ``callback`` once every request read before this
        notification whose key conflicts with ``key`` has been admitted: now, or later from
        the task that admits the last of them (it must be quick and must not raise). Each
        held action is kept until then: the caller bounds how many it holds (one per key,
        say, as a later action can stand for an earlier one)."""
        if not self._order.defer(self._frames_received, key, callback):
            self._run_ordered(callback)

    @staticmethod
    def _run_ordered(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            logger.exception("an action held for admission order failed")

    @classmethod
    def _encode_answer(cls, request: Request, result: Any, error: ProtocolError | None) -> bytes:
        if error is None:
            try:
                return encode_result(request.id, result)
            except (TypeError, ValueError) as exc:
                error = cls._internal_error(request.method, exc)
        try:
            return encode_error(request.id, error)
        except (TypeError, ValueError) as exc:
            # The handler put something orjson cannot encode into the error's data.
            logger.error("error answer to %r not encodable: %r", request.method, exc)
            return encode_error(request.id, ProtocolError(error.code, error.message))

    @staticmethod
    def _internal_error(method: str, exc: BaseException) -> ProtocolError:
        logger.error("request handler for %r failed", method, exc_info=exc)
        return ProtocolError(INTERNAL_ERROR, f"internal error ({type(exc).__name__})")
