"""A network connection as the Trio stream an ACP connection is served over.

The ACP connection (the same one the Unix socket serves) reads newline-delimited JSON-RPC
from :meth:`NetworkChannel.receive_some` and writes whole lines with :meth:`send_all`; the
HTTP layer feeds it POST bodies or WebSocket messages (one message a line) and drains what it
writes through :class:`~maple_acp.net._streams.EventStream` objects:

- over a WebSocket, one stream carries everything;
- over Streamable HTTP, a line about a session (a request or notification whose params name
  it, or the answer to a request that named it) goes to that session's SSE stream once the
  client has opened one, and everything else (and a session's lines until its stream opens)
  to the connection-scoped stream. Nothing is dropped for want of a stream: it waits, within
  the credit window, for the client to open one.

:meth:`send_all` returns once its lines are written to the client's streams: that is when the
peer gives their credit back. Lines for a stream with no receiver (a session stream whose client
went away and may come back with ``Last-Event-ID``, or the connection stream before its GET) are
*parked* instead: ``send_all`` does not wait for them, so one session's absent client never holds
up another session's traffic. What all streams of a connection park together stays within the
credit window (a client that leaves while its stream is being written parks that write too, one
batch at most); past it ``send_all`` waits for room (the client comes back, or the janitor
expires the stream into the connection stream).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Final

import orjson
import trio

from maple_acp.net._streams import EventStream
from maple_acp.rpc import FRAME_OVERHEAD_BYTES

logger = logging.getLogger(__name__)

#: Inbound messages waiting for the connection's reader, at most (a POST waits beyond it).
INBOUND_QUEUE: Final = 16
#: Requests whose answer must find its session's stream; the peer has at most 256 in flight,
#: so a longer table means answers that never came (a bug, not a client): forget the oldest.
MAX_ROUTED_REQUESTS: Final = 1024

IdKey = tuple[str, Any]


def parse_message(data: bytes) -> Any:
    """One JSON value, with integers of any size kept exact (orjson reads an integer beyond
    64 bits as a float, so such a message is read again by the standard library).

    Error handling: ``ValueError`` when ``data`` is not JSON."""
    value = orjson.loads(data)
    if isinstance(value, dict) and type(value.get("id")) is float:
        value = json.loads(data)
    return value


def id_key(message_id: Any) -> IdKey | None:
    """A request id as a table key (``1`` and ``"1"`` are different ids)."""
    if type(message_id) in (int, str):
        return (type(message_id).__name__, message_id)
    return None


def session_of_params(message: dict[str, Any]) -> str | None:
    params = message.get("params")
    if isinstance(params, dict):
        session_id = params.get("sessionId")
        if isinstance(session_id, str):
            return session_id
    return None


class NetworkChannel(trio.abc.Stream):
    """See the module docstring. ``split`` is False for a WebSocket (one stream) and True for
    Streamable HTTP (a connection stream plus one per session)."""

    def __init__(self, *, split: bool, keep_lines: int, keep_bytes: int) -> None:
        self._split = split
        self._keep_lines = keep_lines
        self._keep_bytes = keep_bytes
        self._inbound_send, self._inbound = trio.open_memory_channel[bytes](INBOUND_QUEUE)
        self._leftover = b""
        self._input_done = False
        #: The WebSocket, or the connection-scoped SSE stream.
        self.main = self._new_stream()
        #: Session id -> its SSE stream, from the first GET for it until it expires.
        self.sessions: dict[str, EventStream] = {}
        #: A request's id -> the session its params named (its answer goes the same way).
        self._routes: dict[IdKey, str] = {}
        #: A request's id -> who takes its answer instead of a stream (``initialize``).
        self._captures: dict[IdKey, Callable[[bytes], None]] = {}
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

    async def deliver(self, message: bytes, parsed: Any = None) -> None:
        """Hand one inbound message to the connection (waits while its reader is behind).

        ``parsed`` (Streamable HTTP) is the message as read, to remember which session a
        request names. Raw newlines (JSON whitespace) are spaced out: the reader splits lines.

        Error handling: ``trio.ClosedResourceError`` once the connection no longer reads.
        """
        if isinstance(parsed, dict) and "method" in parsed:
            key = id_key(parsed.get("id"))
            session_id = session_of_params(parsed)
            if key is not None and session_id is not None and self._split:
                if len(self._routes) >= MAX_ROUTED_REQUESTS:
                    self._routes.pop(next(iter(self._routes)))
                self._routes[key] = session_id
        line = message.replace(b"\r", b" ").replace(b"\n", b" ") + b"\n"
        if self._input_done:
            raise trio.ClosedResourceError("the connection's input has ended")
        try:
            await self._inbound_send.send(line)
        except trio.BrokenResourceError:
            raise trio.ClosedResourceError("the connection no longer reads") from None

    def capture(self, message_id: Any, take: Callable[[bytes], None]) -> None:
        """Give the answer to ``message_id`` to ``take`` instead of a stream."""
        key = id_key(message_id)
        if key is not None:
            self._captures[key] = take

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

    # -- trio.abc.Stream (the ACP connection's side) --------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if not self._leftover:
            try:
                self._leftover = await self._inbound.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return b""
        data = self._leftover
        if max_bytes is not None and len(data) > max_bytes:
            self._leftover = data[max_bytes:]
            return data[:max_bytes]
        self._leftover = b""
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed:
            raise trio.ClosedResourceError("the network connection is closed")
        lines = bytes(data).split(b"\n")
        if lines and not lines[-1]:
            lines.pop()
        if not self._split:
            last = self.main.put(lines)
            await self.main.wait_written(last)
        else:
            await self._send_routed(lines)
        if self.closed:
            raise trio.BrokenResourceError("the network connection closed while writing")

    async def _send_routed(self, lines: list[bytes]) -> None:
        by_stream: dict[int, tuple[EventStream, list[bytes]]] = {}
        for line in lines:
            stream = self._route(line)
            if stream is None:
                continue
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

    def _route(self, line: bytes) -> EventStream | None:
        try:
            message = parse_message(line)
        except ValueError:
            return self.main
        if not isinstance(message, dict):
            return self.main
        if "method" in message:
            session_id = session_of_params(message)
        else:
            key = id_key(message.get("id"))
            if key is None:
                return self.main
            take = self._captures.pop(key, None)
            if take is not None:
                take(line)
                return None
            session_id = self._routes.pop(key, None)
        if session_id is None:
            return self.main
        return self.sessions.get(session_id, self.main)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()

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
