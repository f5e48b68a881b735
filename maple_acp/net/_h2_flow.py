"""Hypercorn's HTTP/2 send buffer, held to the client's flow-control window.

Over HTTP/2 hypercorn hands a response body to a per-stream buffer, and its ASGI ``send``
returns once that buffer is under a high-water mark. Its sending task pops from the buffer what
the stream's window allows; at a zero window it pops nothing, and "popped less than the
low-water mark" then lets the writer go anyway. A client that never grows its window would so
make the buffer grow without bound, while the SSE pump, taking ``send`` returning as written,
gives the lines' credit back and asks for more.

:class:`WindowBoundBuffer` is hypercorn's buffer with one rule changed: a push returns only
once every byte it added has been popped, which hypercorn does only within the window. So an
ASGI ``send`` of a body over HTTP/2 returns once the client's window took it, as one over
HTTP/1.1 returns once the socket took it, and a stalled reader holds no more than its window in
hypercorn plus the connection's credit window in the host. :func:`install` puts it in place of
hypercorn's; the module imports hypercorn, so it is imported only where hypercorn is known to
be installed.
"""

from __future__ import annotations

from typing import Final

from hypercorn.protocol import h2 as hypercorn_h2

from maple_acp.net._errors import HttpSetupError

#: What of hypercorn's buffer this one relies on (see :func:`install`).
_RELIED_ON: Final = ("buffer", "_complete", "_is_empty")


class WindowBoundBuffer(hypercorn_h2.StreamBuffer):
    """See the module docstring. One writer per stream pushes (the stream's ASGI task)."""

    async def push(self, data: bytes) -> None:
        if self._complete:
            raise hypercorn_h2.BufferCompleteError()
        self.buffer.extend(data)
        await self._is_empty.clear()
        # Popped empty (sent within the window) or emptied by close (the stream ended).
        while self.buffer:
            await self._is_empty.wait()


def install() -> None:
    """Make hypercorn's HTTP/2 streams use :class:`WindowBoundBuffer` (idempotent).

    Error handling: :class:`HttpSetupError` when the installed hypercorn's buffer is not the
    one this module was written against (serving HTTP/2 with it would let a stalled client
    grow the host without bound).
    """
    if hypercorn_h2.StreamBuffer is WindowBoundBuffer:
        return
    if not issubclass(WindowBoundBuffer, hypercorn_h2.StreamBuffer) or not _known_shape():
        raise HttpSetupError(
            "the installed hypercorn's HTTP/2 send buffer is not one this version of maple-acp "
            "knows: install the hypercorn version the package names"
        )
    hypercorn_h2.StreamBuffer = WindowBoundBuffer  # type: ignore[misc]


def _known_shape() -> bool:
    from hypercorn.trio.worker_context import EventWrapper

    probe = hypercorn_h2.StreamBuffer(EventWrapper)
    return all(hasattr(probe, name) for name in _RELIED_ON) and isinstance(probe.buffer, bytearray)
