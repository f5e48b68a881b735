"""One outbound stream of a network connection: the WebSocket, the connection-scoped SSE
stream, or one session's SSE stream.

A sender (the connection's writer) puts lines and waits until they are *written*: handed to
the HTTP server for the client's socket. Only then does the JSON-RPC peer give their outbound
credit back, so a client that stops reading holds at most the connection's credit window, here
as on the Unix socket. A receiver (the request that serves the stream) attaches, takes what is
pending, writes it and says so.

Every line gets an event id, counting from 1. Written lines are kept, within the credit window,
for a client that comes back with ``Last-Event-ID``: it gets exactly the lines after that id,
then what is pending. An id older than what is kept cannot be served (:class:`StreamGone`, the
HTTP layer's ``410``). A stream without a receiver holds its pending lines until one attaches,
or until the connection's janitor expires it; its senders need not wait for it (the channel
bounds what such streams hold together and lets its writer go on, see
:class:`~maple_acp.net._channel.NetworkChannel`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Final

import trio

from maple_acp.rpc import FRAME_OVERHEAD_BYTES

#: A receiver writes at most about this much per write (the peer's own batch size).
WRITE_BATCH_BYTES: Final = 64 * 1024


class StreamGone(Exception):
    """The events after the client's ``Last-Event-ID`` are no longer kept (or never were)."""


class StreamEnded(Exception):
    """This receiver no longer serves the stream: the connection ended, the stream expired,
    or another receiver took it over."""


class Attachment:
    """One receiver's hold on a stream (a GET request or the WebSocket)."""

    __slots__ = ("replay", "stream")

    def __init__(self, stream: EventStream, replay: list[tuple[int, bytes]]) -> None:
        self.stream = stream
        #: Written events to send again first (a ``Last-Event-ID`` resume).
        self.replay = replay

    @property
    def current(self) -> bool:
        return self.stream.receiver is self and not self.stream.closed

    async def next_batch(self, *, idle_after: float) -> list[tuple[int, bytes]] | None:
        """The events to write next (replayed ones first), or ``None`` after ``idle_after``
        seconds with nothing to write (time for a keepalive).

        Error handling: :class:`StreamEnded` once this receiver no longer serves the stream.
        """
        stream = self.stream
        with trio.move_on_after(idle_after):
            while True:
                if not self.current:
                    raise StreamEnded
                if self.replay:
                    batch, self.replay = self.replay, []
                    return batch
                if stream.pending:
                    return stream.peek_batch()
                await stream.changed()
        if not self.current:
            raise StreamEnded
        return None

    def written(self, batch: list[tuple[int, bytes]]) -> None:
        """The events of ``batch`` reached the HTTP server: keep them, release their senders."""
        if self.current and batch:
            self.stream.commit(batch[-1][0])

    def detach(self) -> None:
        """The client went away (or this request ended): the stream holds what is pending."""
        if self.stream.receiver is self:
            self.stream.receiver = None
            self.stream.detached_at = trio.current_time()
            self.stream.wake()
            self.stream.on_progress()


def _nothing() -> None:
    pass


class EventStream:
    """See the module docstring. ``keep_lines`` / ``keep_bytes`` bound what is kept for a
    resume (the connection's credit window). ``on_progress`` is called whenever lines are
    written or dropped, and whenever a receiver comes or goes."""

    def __init__(
        self, *, keep_lines: int, keep_bytes: int, on_progress: Callable[[], None] = _nothing
    ) -> None:
        self._keep_lines = keep_lines
        self._keep_bytes = keep_bytes
        self.on_progress = on_progress
        self._next_id = 1
        #: (event id, line without its newline) not yet written.
        self.pending: deque[tuple[int, bytes]] = deque()
        #: What ``pending`` holds, charged as the outbound credit charges a line.
        self.pending_bytes = 0
        #: Written events kept for a resume, oldest first, and their charged size.
        self._kept: deque[tuple[int, bytes]] = deque()
        self._kept_bytes = 0
        #: The highest event id written so far.
        self.written_id = 0
        self.receiver: Attachment | None = None
        #: When the last receiver went away (``None`` while one is attached or none ever was).
        self.detached_at: float | None = None
        #: Set when no receiver will ever come again: senders stop waiting.
        self.closed = False
        self._changed = trio.Event()
        self._progress = trio.Event()

    # -- the sender's side --------------------------------------------------------------------

    def put(self, lines: Iterable[bytes]) -> int:
        """Queue ``lines``; the id of the last one (0 if none)."""
        last = 0
        for line in lines:
            last = self._next_id
            self._next_id += 1
            self.pending.append((last, line))
            self.pending_bytes += len(line) + FRAME_OVERHEAD_BYTES
        if last:
            self.wake()
        return last

    async def wait_written(self, event_id: int) -> None:
        """Until the event ``event_id`` is written, or the stream closed."""
        while self.written_id < event_id and not self.closed:
            progress = self._progress
            await progress.wait()

    # -- the receiver's side -----------------------------------------------------------------

    def attach(self, last_event_id: int | None = None) -> Attachment:
        """Become the stream's receiver (a previous one is ended).

        Error handling: :class:`StreamGone` when ``last_event_id`` names an event this stream
        no longer keeps, or one it never sent.
        """
        replay: list[tuple[int, bytes]] = []
        if last_event_id is not None:
            oldest = self._kept[0][0] if self._kept else self.written_id + 1
            if not oldest - 1 <= last_event_id <= self.written_id:
                raise StreamGone
            replay = [event for event in self._kept if event[0] > last_event_id]
        attachment = Attachment(self, replay)
        self.receiver = attachment
        self.detached_at = None
        self.wake()
        self.on_progress()
        return attachment

    def peek_batch(self) -> list[tuple[int, bytes]]:
        batch: list[tuple[int, bytes]] = []
        size = 0
        for event in self.pending:
            batch.append(event)
            size += len(event[1])
            if size >= WRITE_BATCH_BYTES:
                break
        return batch

    def commit(self, through_id: int) -> None:
        pending = self.pending
        kept = self._kept
        while pending and pending[0][0] <= through_id:
            event = pending.popleft()
            kept.append(event)
            charge = len(event[1]) + FRAME_OVERHEAD_BYTES
            self.pending_bytes -= charge
            self._kept_bytes += charge
        while kept and (len(kept) > self._keep_lines or self._kept_bytes > self._keep_bytes):
            self._kept_bytes -= len(kept.popleft()[1]) + FRAME_OVERHEAD_BYTES
        self.written_id = max(self.written_id, through_id)
        progress, self._progress = self._progress, trio.Event()
        progress.set()
        self.on_progress()

    def take_pending(self) -> list[bytes]:
        """Empty the stream of what it never wrote (it expires): the lines, for another
        stream. Its senders are released."""
        lines = [line for _, line in self.pending]
        self.pending.clear()
        self.pending_bytes = 0
        self.close()
        return lines

    def close(self) -> None:
        """No receiver will come again: release the senders, end the receiver."""
        self.closed = True
        self.wake()
        progress, self._progress = self._progress, trio.Event()
        progress.set()
        self.on_progress()

    # -- wake-ups ------------------------------------------------------------------------------

    def wake(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def changed(self) -> None:
        await self._changed.wait()
