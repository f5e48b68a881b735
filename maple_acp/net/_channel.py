"""A network connection as the message transport an ACP connection is served over.

The ACP connection (the same one the Unix socket serves) reads whole JSON-RPC messages from
:meth:`NetworkChannel.receive` and writes them with :meth:`NetworkChannel.send`, each with its
route (:data:`~maple_acp.rpc.Route`); the HTTP layer feeds it POST bodies or WebSocket messages
with the route their answers take and drains what it writes through
:class:`~maple_acp.net._streams.EventStream` objects:

- over a WebSocket, one stream carries everything;
- over Streamable HTTP, a message about a session (the edge names the session it sends about,
  and the HTTP layer names the session a request's params name, whose answer takes that route)
  goes to that session's SSE stream once the client has opened one, and everything else (and a
  session's messages until its stream opens) to the connection-scoped stream; the answer to
  ``initialize`` goes to its POST (an :class:`AnswerCapture` route). Nothing is dropped for want
  of a stream: it waits, within the credit window, for the client to open one.

:meth:`NetworkChannel.send` returns once its lines are written to the client's streams: that is
when the peer gives their credit back. Lines for a stream with no receiver (a session stream
whose client went away and may come back with ``Last-Event-ID``, or the connection stream
before its GET) are *parked* instead: ``send`` does not wait for them, so one session's absent
client never holds up another session's traffic. What all streams of a connection park together
stays within the credit window (a client that leaves while its stream is being written parks
that write too, one batch at most); past it ``send`` waits for room (the client comes back, or
the janitor expires the stream into the connection stream).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import trio

from maple_acp.net._streams import EventStream
from maple_acp.rpc import FRAME_OVERHEAD_BYTES, MessageTransport, Received, Route

logger = logging.getLogger(__name__)

#: Inbound messages waiting for the connection's reader, at most (a POST waits beyond it).
INBOUND_QUEUE: Final = 16


class AnswerCapture:
    """A route that hands the message to ``take`` instead of a stream: the answer to an
    ``initialize`` POST, which that POST's response carries."""

    __slots__ = ("take",)

    def __init__(self, take: Callable[[bytes], None]) -> None:
        self.take = take


class NetworkChannel(MessageTransport):
    """See the module docstring. ``split`` is False for a WebSocket (one stream) and True for
    Streamable HTTP (a connection stream plus one per session)."""

    def __init__(self, *, split: bool, keep_lines: int, keep_bytes: int) -> None:
        self._split = split
        self._keep_lines = keep_lines
        self._keep_bytes = keep_bytes
        self._inbound_send, self._inbound = trio.open_memory_channel[tuple[bytes, Route]](
            INBOUND_QUEUE
        )
        self._input_done = False
        #: The WebSocket, or the connection-scoped SSE stream.
        self.main = self._new_stream()
        #: Session id -> its SSE stream, from the first GET for it until it expires.
        self.sessions: dict[str, EventStream] = {}
        self.closed = False
        self._closed_event = trio.Event()
        #: Set whenever a stream is attached or detached (the janitor watches it).
        self.streams_changed = trio.Event()
        #: Set whenever any stream wrote or dropped lines, or gained or lost its receiver.
        self._progress = trio.Event()

    def _new_stream(self) -> EventStream:
        return EventStream(
            keep_lines=self._keep_lines,
            keep_bytes=self._keep_bytes,
            on_progress=self._note_progress,
        )

    def _note_progress(self) -> None:
        progress, self._progress = self._progress, trio.Event()
        progress.set()

    # -- the client's side (the HTTP layer) ----------------------------------------------------

    async def deliver(self, message: bytes, route: Route = None) -> None:
        """Hand one inbound message to the connection (waits while its reader is behind).

        ``route`` is where an answer to it goes (Streamable HTTP): the session its params
        name, an :class:`AnswerCapture`, or ``None`` for the connection stream.

        Error handling: ``trio.ClosedResourceError`` once the connection no longer reads.
        """
        if self._input_done:
            raise trio.ClosedResourceError("the connection's input has ended")
        try:
            await self._inbound_send.send((message, route))
        except trio.BrokenResourceError:
            raise trio.ClosedResourceError("the connection no longer reads") from None

    def finish_input(self) -> None:
        """The client is gone (its WebSocket closed, a DELETE, the idle bound): the reader
        sees the end of its input, as with a socket's EOF."""
        self._input_done = True
        self._inbound_send.close()

    def stream_for(self, session_id: str) -> EventStream:
        """The SSE stream of ``session_id``, made on its first GET."""
        stream = self.sessions.get(session_id)
        if stream is None:
            stream = self.sessions[session_id] = self._new_stream()
        return stream

    def expire(self, session_id: str) -> None:
        """A session stream without a receiver past the resume window: what it still held
        goes to the connection stream (never dropped), and so does anything later for it."""
        stream = self.sessions.pop(session_id, None)
        if stream is not None:
            lines = stream.take_pending()
            if lines:
                self.main.put(lines)

    def note_streams_changed(self) -> None:
        changed, self.streams_changed = self.streams_changed, trio.Event()
        changed.set()

    def attached_streams(self) -> int:
        streams = [self.main, *self.sessions.values()]
        return sum(1 for stream in streams if stream.receiver is not None)

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    # -- the message transport (the ACP connection's side) -------------------------------------

    async def receive(self) -> Received | None:
        try:
            message, route = await self._inbound.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return None
        return (message,), route

    async def send(self, lines: list[bytes], routes: list[Route]) -> None:
        if self.closed:
            raise trio.ClosedResourceError("the network connection is closed")
        if not self._split:
            # One stream: every route leads to it. A stream holds a message without its "\n".
            last = self.main.put([line[:-1] for line in lines])
            await self.main.wait_written(last)
        else:
            await self._send_routed(lines, routes)
        if self.closed:
            raise trio.BrokenResourceError("the network connection closed while writing")

    async def _send_routed(self, lines: list[bytes], routes: list[Route]) -> None:
        by_stream: dict[int, tuple[EventStream, list[bytes]]] = {}
        main, sessions = self.main, self.sessions
        for line, route in zip(lines, routes, strict=True):
            line = line[:-1]
            if route is None:
                stream = main
            elif type(route) is str:
                stream = sessions.get(route, main)
            elif type(route) is AnswerCapture:
                route.take(line)
                continue
            else:
                stream = main
            entry = by_stream.get(id(stream))
            if entry is None:
                by_stream[id(stream)] = (stream, [line])
            else:
                entry[1].append(line)
        waits = [await self._hand_over(stream, group) for stream, group in by_stream.values()]
        # Until every line is written, except those parked on a stream with no receiver. (A
        # stream that loses its receiver meanwhile parks what it holds, past the window by at
        # most this batch; its next lines wait for room in _hand_over.)
        while not self.closed:
            if all(
                stream.receiver is None or stream.closed or stream.written_id >= last
                for stream, last in waits
            ):
                return
            await self._progress.wait()

    async def _hand_over(self, stream: EventStream, group: list[bytes]) -> tuple[EventStream, int]:
        """Put ``group`` on ``stream``, as much as the credit window lets park at a time when
        it has no receiver; the stream that took the last line, and that line's id."""
        start = last = 0
        while start < len(group) and not self.closed:
            if stream.closed:
                # It expired: its lines went to the connection stream, and so do these.
                stream = self.main
                continue
            count = len(group) - start if stream.receiver is not None else self._room(group, start)
            if not count:
                await self._progress.wait()
                continue
            last = stream.put(group[start : start + count])
            start += count
        return stream, last

    def _room(self, group: list[bytes], start: int) -> int:
        """How many lines of ``group`` from ``start`` on may park now: what fits in the credit
        window beside what is parked already (one line always fits an empty parking: it
        holds the peer's credit)."""
        lines, size = self.parked()
        if not lines:
            lines, size = 1, len(group[start]) + FRAME_OVERHEAD_BYTES
            start += 1
            count = 1
        else:
            count = 0
        for line in group[start:]:
            charge = len(line) + FRAME_OVERHEAD_BYTES
            if lines + 1 > self._keep_lines or size + charge > self._keep_bytes:
                break
            lines += 1
            size += charge
            count += 1
        return count

    def parked(self) -> tuple[int, int]:
        """The lines, and their charge in bytes, held by streams with no receiver."""
        lines = size = 0
        for stream in (self.main, *self.sessions.values()):
            if stream.receiver is None:
                lines += len(stream.pending)
                size += stream.pending_bytes
        return lines, size

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """End every stream (their receivers finish their responses) and the input."""
        if self.closed:
            return
        self.closed = True
        self.finish_input()
        self._inbound.close()
        self.main.close()
        for stream in self.sessions.values():
            stream.close()
        self._closed_event.set()
