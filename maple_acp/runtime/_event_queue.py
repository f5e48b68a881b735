"""A run's bounded, ordered event stream: the queue the backend fills and the caller drains,
then the terminal events retained after the backend's side closed."""

from __future__ import annotations

import contextlib
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
    """One run's events: ``send``/``send_nowait`` while the backend runs, ``close`` once, then
    ``retain`` the terminal events; ``reader()`` (once) yields them all in order."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[RunEvent](RUN_EVENT_QUEUE)
        self._tail: list[RunEvent] = []
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
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            with contextlib.suppress(trio.ClosedResourceError):
                await self._send.send(event)
                self.sent += 1
            self._unyielded = 0
            return
        except trio.ClosedResourceError:
            return
        self.sent += 1
        self._unyielded += 1
        if self._unyielded >= EMIT_BATCH:
            self._unyielded = 0
            await trio.lowlevel.checkpoint()

    def send_nowait(self, event: RunEvent) -> bool:
        """Queue ``event`` without waiting. False if the queue is full (the event is not
        queued: the caller must end the run, since the stream would have a hole)."""
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            return False
        except trio.ClosedResourceError:
            return True
        self.sent += 1
        return True

    def close(self, tail: list[RunEvent]) -> None:
        """No more sends; ``tail`` follows the queued events."""
        self._tail.extend(tail)
        self._send.close()

    def reader(self) -> _QueueReader:
        if self._reader_taken:
            raise RuntimeError("a run's events can be read only once")
        self._reader_taken = True
        return _QueueReader(self._receive, self._tail)

    def batch_reader(self) -> _BatchReader:
        return _BatchReader(self.reader())


class _QueueReader:
    """Async iterator over the queued events, then the retained terminal ones."""

    def __init__(self, receive: trio.MemoryReceiveChannel[RunEvent], tail: list[RunEvent]) -> None:
        self._receive = receive
        self._tail = tail
        self._tail_index: int | None = None

    def __aiter__(self) -> _QueueReader:
        return self

    async def __anext__(self) -> RunEvent:
        if self._tail_index is None:
            try:
                # Queued events are taken without a scheduler pass each; the consumer waits
                # only when the queue is empty.
                try:
                    return self._receive.receive_nowait()
                except trio.WouldBlock:
                    return await self._receive.receive()
            except trio.EndOfChannel:
                self._tail_index = 0
        if self._tail_index < len(self._tail):
            event = self._tail[self._tail_index]
            self._tail_index += 1
            return event
        raise StopAsyncIteration

    async def next_batch(self) -> list[RunEvent]:
        """Every event available now (at least one, at most ``MAX_BATCH``), waiting only
        for the first. Raises ``StopAsyncIteration`` after the last one."""
        batch = [await self.__anext__()]
        if self._tail_index is None:
            try:
                while len(batch) < MAX_BATCH:
                    batch.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                pass
        while self._tail_index is not None and self._tail_index < len(self._tail):
            batch.append(self._tail[self._tail_index])
            self._tail_index += 1
        return batch


class _BatchReader:
    """Async iterator over a run's events in batches (see ``_QueueReader.next_batch``)."""

    def __init__(self, reader: _QueueReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _BatchReader:
        return self

    async def __anext__(self) -> list[RunEvent]:
        return await self._reader.next_batch()
