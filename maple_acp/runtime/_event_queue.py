"""A run's bounded, ordered event stream: the queue the backend fills and the caller drains,
then the terminal events retained after the backend's side closed.

A plain deque with two wake-up events rather than a trio memory channel: one producer and one
consumer need none of a channel's generality, and this is the per-event path of every streamed
update (about a third cheaper per event than a channel's send and receive).
"""

from __future__ import annotations

import collections
import logging

import trio

from maple_acp.runtime._events import RunEvent

logger = logging.getLogger(__name__)

#: Events of one run waiting for its consumer. An awaited send waits for room (backpressure
#: on the backend); a send that cannot wait and finds no room cancels the run, because a
#: dropped event cannot be reconstructed.
RUN_EVENT_QUEUE = 256
#: A backend emitting into a queue with room checkpoints once per this many events.
EMIT_BATCH = 64
#: Events a consumer takes in one batch, at most (the queue's size: one batch drains it).
MAX_BATCH = RUN_EVENT_QUEUE


class RunEventQueue:
    """One run's events: ``send``/``send_nowait`` while the backend runs, ``close`` once with
    the terminal events; ``reader()`` (once) yields them all in order."""

    def __init__(self) -> None:
        #: Set by ``run_cancelled``: ``offer`` reads it per event (a plain attribute, where
        #: trio's ``checkpoint_if_cancelled`` or a scope's ``cancel_called`` costs a task or
        #: clock lookup), so that cancelling the run stops its backend at its next event; an
        #: outer cancellation is seen within EMIT_BATCH events.
        self._run_cancelled = False
        self._items: collections.deque[RunEvent] = collections.deque()
        self._tail: list[RunEvent] = []
        self._closed = False
        # Set (and dropped) by whoever makes progress possible for a waiting side.
        self._readable: trio.Event | None = None
        self._writable: trio.Event | None = None
        self._unyielded = 0
        self._reader_taken = False
        #: Events queued so far (the terminal ones not included).
        self.sent = 0

    async def send(self, event: RunEvent) -> None:
        # While the queue has room the event goes in without a scheduler pass, so a streaming
        # backend hands over events in batches; only a full queue makes it wait (that wait is
        # the backpressure), and every EMIT_BATCH events it checkpoints anyway, so that a
        # cancelled backend stops within one batch.
        # A cancelled backend must not go on emitting for the rest of a batch.
        await trio.lowlevel.checkpoint_if_cancelled()
        if len(self._items) < RUN_EVENT_QUEUE:
            if not self._closed:
                self._put(event)
            self._unyielded += 1
            if self._unyielded >= EMIT_BATCH:
                self._unyielded = 0
                await trio.lowlevel.checkpoint()
            return
        while len(self._items) >= RUN_EVENT_QUEUE and not self._closed:
            writable = self._writable = trio.Event()
            await writable.wait()
        if not self._closed:
            self._put(event)
        self._unyielded = 0

    def offer(self, event: RunEvent) -> bool:
        """The streaming hot path: queue ``event`` at once if that needs no wait and no
        scheduler pass (the queue has room, the run is not cancelled, no pass is due). False
        means nothing was done and the caller must ``await send(event)``.

        Trio's rule that a backend loop stays cancellable and does not starve the scheduler
        holds through ``send``: every EMIT_BATCH-th event goes there and checkpoints."""
        if (
            self._unyielded < EMIT_BATCH - 1
            and len(self._items) < RUN_EVENT_QUEUE
            and not self._run_cancelled
        ):
            self._unyielded += 1
            if not self._closed:
                # _put, inlined: this runs once per streamed chunk.
                self._items.append(event)
                self.sent += 1
                readable = self._readable
                if readable is not None:
                    self._readable = None
                    readable.set()
            return True
        return False

    def run_cancelled(self) -> None:
        """The run was cancelled: every later event goes through ``send``'s checkpoint."""
        self._run_cancelled = True

    def send_nowait(self, event: RunEvent) -> bool:
        """Queue ``event`` without waiting. False if the queue is full (the event is not
        queued: the caller must end the run, since the stream would have a hole)."""
        if self._closed:
            return True
        if len(self._items) >= RUN_EVENT_QUEUE:
            return False
        self._put(event)
        return True

    def put_retained(self, event: RunEvent) -> None:
        """Queue ``event`` without waiting and past the bound: only for the closing events of
        a child session this run delegated to (a handful each, at most
        ``MAX_RUNNING_CHILDREN`` at once), which must precede the run's own end."""
        if not self._closed:
            self._put(event)

    def _put(self, event: RunEvent) -> None:
        self._items.append(event)
        self.sent += 1
        readable = self._readable
        if readable is not None:
            self._readable = None
            readable.set()

    def close(self, tail: list[RunEvent]) -> None:
        """No more sends; ``tail`` follows the queued events."""
        self._tail.extend(tail)
        self._closed = True
        for waiter in (self._readable, self._writable):
            if waiter is not None:
                waiter.set()
        self._readable = self._writable = None

    def reader(self) -> _QueueReader:
        if self._reader_taken:
            raise RuntimeError("a run's events can be read only once")
        self._reader_taken = True
        return _QueueReader(self)

    def batch_reader(self) -> _BatchReader:
        return _BatchReader(self.reader())

    # -- the consumer's side (through _QueueReader) ------------------------------------------

    def take(self) -> RunEvent | None:
        """The next queued event, or None if none is queued now."""
        if not self._items:
            return None
        event = self._items.popleft()
        writable = self._writable
        if writable is not None:
            self._writable = None
            writable.set()
        return event

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def empty(self) -> bool:
        return not self._items

    @property
    def tail(self) -> list[RunEvent]:
        return self._tail

    async def wait_readable(self) -> None:
        if self._items or self._closed:
            return
        readable = self._readable = trio.Event()
        await readable.wait()


class _QueueReader:
    """Async iterator over the queued events, then the retained terminal ones."""

    def __init__(self, queue: RunEventQueue) -> None:
        self._queue = queue
        self._tail_index = 0

    def __aiter__(self) -> _QueueReader:
        return self

    async def __anext__(self) -> RunEvent:
        queue = self._queue
        while True:
            # Queued events are taken without a scheduler pass each; the consumer waits only
            # when the queue is empty.
            event = queue.take()
            if event is not None:
                return event
            if queue.closed:
                break
            await queue.wait_readable()
        tail = queue.tail
        if self._tail_index < len(tail):
            event = tail[self._tail_index]
            self._tail_index += 1
            return event
        raise StopAsyncIteration

    async def next_batch(self) -> list[RunEvent]:
        """Every event available now (at least one, at most ``MAX_BATCH`` queued ones plus
        the terminal tail), waiting only for the first. Raises ``StopAsyncIteration`` after
        the last one."""
        batch = [await self.__anext__()]
        queue = self._queue
        while len(batch) < MAX_BATCH:
            event = queue.take()
            if event is None:
                break
            batch.append(event)
        if queue.closed and queue.empty:
            tail = queue.tail
            batch.extend(tail[self._tail_index :])
            self._tail_index = len(tail)
        return batch


class _BatchReader:
    """Async iterator over a run's events in batches (see ``_QueueReader.next_batch``)."""

    def __init__(self, reader: _QueueReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _BatchReader:
        return self

    async def __anext__(self) -> list[RunEvent]:
        return await self._reader.next_batch()
