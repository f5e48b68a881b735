"""The network listener's TCP side: our accept loop in front of hypercorn's connection handling.

Hypercorn's own worker accepts every connection the kernel queues, keeps a connection whose
client has gone until its keep-alive runs out, and leaves ``accept`` failing for want of
descriptors to ``trio.serve_listeners``, which logs a traceback every tenth of a second. A
neighbour without the token could so exhaust the host's descriptors and take the Unix socket
down with the network. Here:

- at most :data:`MAX_TCP_CONNECTIONS` connections are open at once, and none is admitted that
  would leave fewer than :data:`FD_RESERVE` descriptors free (those are the Unix socket's, the
  store's and the tools'); a connection beyond either is closed at accept;
- a connection that has not sent a complete request (its headers) within
  :data:`FIRST_REQUEST_S` of its accept, TLS handshake included, is closed;
- a connection whose client has finished sending is closed as soon as its requests are
  answered, never held for the keep-alive;
- ``accept`` failing for want of a resource, and the refusals, are told in one line a minute
  with a count, never a line per try (``maple_acp.listeners.AcceptRetry``, as on the Unix
  socket).

Each admitted connection is hypercorn's own ``TCPServer`` (a small subclass,
:class:`_TcpConnection`, adds the first-request deadline and the early close); the protocol
handling (HTTP/1.1, HTTP/2, WebSocket, TLS) is entirely hypercorn's. What the subclass relies
on is checked by ``tests/net/test_tcp_admission.py``. This module imports hypercorn: it is
imported only once the listener starts.
"""

from __future__ import annotations

import logging
import math
import resource
import socket
from typing import Any, Final

import trio
from hypercorn.config import Config
from hypercorn.events import Event, Updated
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app

from maple_acp.listeners import AcceptRetry, RepeatReport

logger = logging.getLogger(__name__)

#: Open TCP connections at once: the owner's clients need a handful (a browser opens six per
#: host); each costs a descriptor and buffers, and the 65th is closed at accept.
MAX_TCP_CONNECTIONS: Final = 64
#: From accept to a complete first request (its headers), TLS handshake included: a client
#: that means to talk sends at once, and a silent one holds a slot.
FIRST_REQUEST_S: Final = 5.0
#: Descriptors the TCP side never takes: they keep the Unix socket, the store and the tools'
#: pipes working while the network is flooded under a low open-file limit.
FD_RESERVE: Final = 32


class TcpAdmission:
    """Which accepted connections may stay (sans-I/O): at most ``maximum`` at once, and none
    whose descriptor number shows fewer than ``reserve`` free below ``fd_limit`` (descriptors
    are allocated lowest first, so the new one's number is a floor on those in use)."""

    def __init__(self, maximum: int, fd_limit: int | None, reserve: int = FD_RESERVE) -> None:
        self.maximum = maximum
        self.active = 0
        self._fd_ceiling = None if fd_limit is None else fd_limit - reserve

    def try_admit(self, fileno: int) -> str | None:
        """Admit one (``None``) or say why not, in a few words for the log."""
        if self.active >= self.maximum:
            return f"{self.active} of {self.maximum} connections open"
        if self._fd_ceiling is not None and fileno >= self._fd_ceiling:
            return "the process is near its open-file limit"
        self.active += 1
        return None

    def release(self) -> None:
        self.active -= 1


def open_file_limit() -> int | None:
    """The soft ``RLIMIT_NOFILE`` (``None``: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


class _TcpConnection(TCPServer):
    """Hypercorn's connection, closed at its first-request deadline and as soon as its client
    has finished sending (no keep-alive for a connection nobody can send on)."""

    def __init__(
        self,
        app: AppWrapper,
        config: Config,
        context: WorkerContext,
        state: ConnectionState,
        stream: Any,
        first_request_by: float,
    ) -> None:
        super().__init__(app, config, context, state, stream)
        self._first_request = trio.CancelScope(deadline=first_request_by)
        self._reading = True

    async def run(self) -> None:
        with self._first_request:
            await super().run()
        if self._first_request.cancelled_caught:
            logger.debug("closed a TCP connection that sent no request in time")

    async def protocol_send(self, event: Event) -> None:
        # HTTP/1.1 and HTTP/2 both report a request's arrival as "not idle".
        if isinstance(event, Updated):
            if not event.idle:
                self._first_request.deadline = math.inf
            elif not self._reading:
                # The client finished sending: nothing can come to wait for. Without the idle
                # timer the connection ends once its last stream has.
                return
        await super().protocol_send(event)

    async def _read_data(self) -> None:
        await super()._read_data()
        self._reading = False
        await self.idle_task.stop()


class TcpWorker:
    """Serves ``app`` on the sockets ``config`` binds (see the module docstring)."""

    def __init__(
        self,
        app: Any,
        config: Config,
        *,
        max_connections: int = MAX_TCP_CONNECTIONS,
        first_request_s: float = FIRST_REQUEST_S,
        fd_limit: int | None = None,
    ) -> None:
        self._app = wrap_app(app, config.wsgi_max_body_size, "asgi")
        self._config = config
        self._first_request_s = first_request_s
        self._context = WorkerContext(None)
        self._state = ConnectionState({})
        self._ssl = config.create_ssl_context()
        self.admission = TcpAdmission(max_connections, fd_limit)
        self._accepting = AcceptRetry("the network listener")
        self._refusals = RepeatReport(trio.current_time)

    async def serve(
        self, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Bind, report the bound addresses (``http://host:port``), serve until cancelled.

        Resource handling: the listening sockets and every connection live in a nursery this
        method owns; cancelling it closes them all.

        Error handling: ``OSError`` from binding propagates before anything listens;
        ``accept`` failing with EMFILE/ENFILE/ENOMEM/ENOBUFS is retried after a short pause
        and told once a minute (``maple_acp.listeners.AcceptRetry``); any other accept error
        propagates.
        """
        sockets = self._config.create_sockets()
        listening = [*sockets.secure_sockets, *sockets.insecure_sockets]
        scheme = "https" if self._ssl is not None else "http"
        async with trio.open_nursery() as nursery:
            binds = []
            for sock in listening:
                sock.listen(self._config.backlog)
                binds.append(f"{scheme}://{repr_socket_addr(sock.family, sock.getsockname())}")
                listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                nursery.start_soon(self._accept_loop, listener, nursery)
            task_status.started(binds)

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        async with listener:
            while True:
                stream = await self._accepting.accept(listener)
                refusal = self.admission.try_admit(stream.socket.fileno())
                if refusal is not None:
                    self._refused(refusal)
                    # Closed at once: no handshake, no buffers.
                    stream.socket.close()
                    continue
                nursery.start_soon(self._serve_connection, stream)

    def _refused(self, reason: str) -> None:
        count = self._refusals.note()
        if count:
            logger.warning(
                "refused %d TCP connection%s in the last minute at accept: %s",
                count,
                "" if count == 1 else "s",
                reason,
            )

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        served: Any = stream
        deadline = trio.current_time() + self._first_request_s
        try:
            if not await _sends_anything(stream.socket, deadline):
                # Closed, or silent for the whole deadline, before its first byte: nothing to
                # hand hypercorn (most of a connect-and-close flood ends here, cheaply).
                return
            if self._ssl is not None:
                served = trio.SSLStream(stream, self._ssl, server_side=True, https_compatible=True)
            connection = _TcpConnection(
                self._app, self._config, self._context, self._state, served, deadline
            )
            await connection.run()
        finally:
            self.admission.release()
            await trio.aclose_forcefully(served)


async def _sends_anything(sock: trio.socket.SocketType, deadline: float) -> bool:
    """Whether the peer's first byte arrives before ``deadline``; ``False`` for a peer that
    closed (or reset) first, or stayed silent. The byte is left where it is."""
    with trio.move_on_at(deadline):
        try:
            return bool(await sock.recv(1, socket.MSG_PEEK))
        except OSError:
            return False
    return False


__all__ = [
    "FIRST_REQUEST_S",
    "MAX_TCP_CONNECTIONS",
    "TcpAdmission",
    "TcpWorker",
    "open_file_limit",
]
