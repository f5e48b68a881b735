"""What a :class:`~maple_acp.rpc.JsonRpcPeer` reads messages from and writes them to.

The peer speaks in whole messages, each one JSON text; how they travel is the transport's:

- :class:`LineTransport` frames them as newline-delimited lines over a byte stream (the Unix
  socket, a pipe, a memory stream in a test). It is the peer's line framing, moved here.
- a message transport (the network's WebSocket and Streamable HTTP) carries each message whole,
  with its *route*: which of its ways to the client the message takes. A route is the
  transport's business and opaque to the peer: the edge names a session's id for what it sends
  about that session, and an answer takes the route the transport gave its request.

The rules about messages stay the peer's whatever the transport: the credit window (a
message's credit comes back once :meth:`MessageTransport.send` returns), the inbound frame cap
and the admission order.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Hashable, Sequence
from typing import Final, TypeAlias

import trio

from ._exceptions import FrameTooLong
from ._framing import MAX_LINE_BYTES, LineFramer

#: Where a message goes on a transport with more than one way to the other side (the id of
#: the session it is about, say); ``None``: the connection's own way. The socket has only one.
Route: TypeAlias = Hashable | None
#: What one read yields: messages in arrival order, and the route their answers take.
Received: TypeAlias = tuple[Sequence[bytes], Route]

#: Bytes asked of a byte stream per read (reads above 128 KiB pay an mmap each).
READ_CHUNK_BYTES: Final = 64 * 1024


class MessageTransport(trio.abc.AsyncResource):
    """Whole messages each way, for one connection; the peer owns it and closes it.

    Error handling: ``trio.BrokenResourceError`` or ``trio.ClosedResourceError`` from either
    direction ends the connection as the other side going away."""

    #: Whether the transport frames inbound messages itself and enforces the frame cap while
    #: it does (the peer checks each message's size otherwise).
    frames_inbound: bool = False

    @abstractmethod
    async def receive(self) -> Received | None:
        """The next inbound messages (one JSON text each, no terminator needed) and the route
        their answers take; ``None`` once the other side has finished sending."""

    @abstractmethod
    async def send(self, lines: list[bytes], routes: list[Route]) -> None:
        """Write ``lines`` (each one message ending in its ``\\n``) in order, ``routes[i]``
        the route of ``lines[i]``. Returns once they are written, which is when the peer
        gives their credit back: a transport that returns earlier lets its client hold more
        than the credit window."""


class LineTransport(MessageTransport):
    """Newline-delimited messages over a byte stream.

    Reads are split with :class:`~maple_acp.rpc.LineFramer` (``max_line_bytes`` is the frame
    cap: a longer line raises :class:`~maple_acp.rpc.FrameTooLong` from :meth:`receive`);
    writes join a batch of lines into one ``send_all``. Routes are ignored: a byte stream has
    one way."""

    __slots__ = ("_ended", "_framer", "stream")

    frames_inbound = True

    def __init__(self, stream: trio.abc.Stream, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.stream = stream
        self._framer = LineFramer(max_line_bytes=max_line_bytes)
        self._ended = False

    async def receive(self) -> Received | None:
        if self._ended:
            return None
        data = await self.stream.receive_some(READ_CHUNK_BYTES)
        if not data:
            self._ended = True
            # A last line without its newline (a side that closed right after it) still counts.
            last = self._framer.feed_eof()
            return None if last is None else ([last], None)
        return self._framer.feed(data if type(data) is bytes else bytes(data)), None

    async def send(self, lines: list[bytes], routes: list[Route]) -> None:
        await self.stream.send_all(lines[0] if len(lines) == 1 else b"".join(lines))

    async def aclose(self) -> None:
        await self.stream.aclose()


def capped(messages: Sequence[bytes], cap: int) -> list[bytes]:
    """A message transport's messages held to the frame cap as a line framer holds lines
    (:class:`~maple_acp.rpc.FrameTooLong` past it); a blank message is skipped, as a blank
    line is."""
    kept = []
    for message in messages:
        if len(message) > cap:
            raise FrameTooLong(f"inbound message exceeds {cap} bytes ({len(message)})")
        if message and not message.isspace():
            kept.append(message)
    return kept


def as_transport(
    stream: trio.abc.Stream | MessageTransport, *, max_line_bytes: int
) -> MessageTransport:
    """``stream`` as the peer's transport: a byte stream is framed in lines."""
    if isinstance(stream, MessageTransport):
        return stream
    return LineTransport(stream, max_line_bytes=max_line_bytes)
