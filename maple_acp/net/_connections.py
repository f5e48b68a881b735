"""The listener's network connections: what it needs of the host, the bounds a connection
keeps, and the table that makes each connection and runs it until it ends.

A connection here is an ACP connection like a Unix-socket one: the host serves it over a
:class:`~maple_acp.net._channel.NetworkChannel` and counts it in the same connection limit.
Each connection runs in the listener's nursery, not in a request's task: a Streamable HTTP
connection outlives every request it is made of. Its janitor ends it once no stream has been
open for the idle bound, and expires session streams left without a receiver past the resume
window.

Each connection remembers the generation of the token it was admitted under. The table looks
at the token file a few times a second and ends, like a disconnect, every connection whose
generation is no longer the one in force: a rotated token (or a file that vanished or that
others can read) leaves nobody talking under the old one, over WebSocket or SSE alike.
"""

from __future__ import annotations

import logging
import secrets
from typing import Final, Protocol

import attrs
import trio

from maple_acp.listeners import ConnectionHost
from maple_acp.net._channel import NetworkChannel

logger = logging.getLogger(__name__)

#: An SSE stream with nothing to say sends a comment this often, so proxies keep it open.
SSE_KEEPALIVE_S: Final = 15.0
#: A Streamable HTTP connection with no stream open this long ends like a disconnect.
IDLE_CONNECTION_S: Final = 60.0
#: A session stream's client may come back with ``Last-Event-ID`` within this.
RESUME_WINDOW_S: Final = 30.0
#: ``initialize`` is answered in its POST; a host that does not answer within this is 504.
INITIALIZE_TIMEOUT_S: Final = 30.0
#: How often the token file is looked at between requests: connections admitted under a
#: rotated token end within twice this (one ``lstat`` each time: cheap).
TOKEN_CHECK_INTERVAL_S: Final = 0.25


#: What the listener needs of the ACP service: the shape every listener's host has
#: (``maple_acp.edge.AcpService`` is one).
NetworkHost = ConnectionHost


class TokenWatch(Protocol):
    """The token in force as the table follows it (``maple_acp.net.TokenFile`` is one)."""

    @property
    def generation(self) -> int:
        """Changes whenever the token in force does, or none is."""

    def refresh(self) -> None:
        """Look at the token file again."""


@attrs.frozen(kw_only=True)
class NetworkLimits:
    #: The connection's outbound credit window: what a stream keeps for a resume.
    keep_lines: int
    keep_bytes: int
    #: The largest POST body or WebSocket message (the inbound frame cap).
    max_message_bytes: int
    keepalive_s: float = SSE_KEEPALIVE_S
    idle_s: float = IDLE_CONNECTION_S
    resume_s: float = RESUME_WINDOW_S
    initialize_timeout_s: float = INITIALIZE_TIMEOUT_S


@attrs.define(eq=False)
class NetworkConnection:
    id: str
    channel: NetworkChannel
    #: "http" (Streamable HTTP) or "ws".
    kind: str
    #: Since when no stream has been open (``None`` while one is).
    idle_since: float | None = None
    #: The token generation it was admitted under (see :class:`TokenWatch`).
    generation: int = 0


class ConnectionTable:
    """The live connections by id. ``nursery`` is the listener's: connections run in it, and
    so does the watch of ``token`` (none: every connection is of generation 0, forever)."""

    def __init__(
        self,
        host: NetworkHost,
        nursery: trio.Nursery,
        limits: NetworkLimits,
        token: TokenWatch | None = None,
    ) -> None:
        self.host = host
        self.limits = limits
        self._nursery = nursery
        self._token = token
        self.by_id: dict[str, NetworkConnection] = {}
        if token is not None:
            nursery.start_soon(self._watch_token, token)

    def generation(self) -> int:
        """The token generation in force now (read it in the same step as the token check
        that admitted a request: no checkpoint between them)."""
        return 0 if self._token is None else self._token.generation

    def new(self, kind: str, generation: int | None = None) -> NetworkConnection:
        """A connection of ``kind`` under a fresh id, admitted under token ``generation`` (by
        default the one in force now); its slot is already taken
        (:meth:`NetworkHost.try_admit`). It runs once :meth:`start` is called."""
        channel = NetworkChannel(
            split=kind == "http",
            keep_lines=self.limits.keep_lines,
            keep_bytes=self.limits.keep_bytes,
        )
        connection = NetworkConnection(
            id=secrets.token_urlsafe(18),
            channel=channel,
            kind=kind,
            idle_since=trio.current_time(),
            generation=self.generation() if generation is None else generation,
        )
        self.by_id[connection.id] = connection
        return connection

    async def start(self, connection: NetworkConnection) -> None:
        """Run ``connection`` in the listener's nursery; returns once it runs."""
        await self._nursery.start(self._run, connection)

    async def _run(
        self,
        connection: NetworkConnection,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve one admitted connection; its slot and its id go when it ends."""
        try:
            async with trio.open_nursery() as nursery:
                if connection.kind == "http":
                    nursery.start_soon(self._janitor, connection)
                task_status.started()
                try:
                    await self.host.serve_stream(connection.channel)
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            self.host.release()
            connection.channel.close()
            self.by_id.pop(connection.id, None)

    async def _janitor(self, connection: NetworkConnection) -> None:
        """Ends a Streamable HTTP connection left with no stream for the idle bound, and
        expires session streams left without a receiver past the resume window."""
        channel = connection.channel
        limits = self.limits
        while not channel.closed:
            changed = channel.streams_changed
            now = trio.current_time()
            deadline = float("inf")
            if channel.attached_streams() == 0:
                if connection.idle_since is None:
                    connection.idle_since = now
                if now >= connection.idle_since + limits.idle_s:
                    logger.info(
                        "ending a network connection with no stream open for %.0f s",
                        limits.idle_s,
                    )
                    channel.finish_input()
                    return
                deadline = connection.idle_since + limits.idle_s
            else:
                connection.idle_since = None
            for session_id, stream in list(channel.sessions.items()):
                if stream.receiver is None and stream.detached_at is not None:
                    expires = stream.detached_at + limits.resume_s
                    if now >= expires:
                        channel.expire(session_id)
                    else:
                        deadline = min(deadline, expires)
            with trio.move_on_at(deadline):
                await changed.wait()

    async def _watch_token(self, token: TokenWatch) -> None:
        """Ends every connection admitted under a token no longer in force."""
        while True:
            await trio.sleep(TOKEN_CHECK_INTERVAL_S)
            token.refresh()
            self.end_stale()

    def end_stale(self) -> None:
        """End, like a disconnect, every connection admitted under an older token generation:
        its streams finish, its WebSocket closes, the host sees its input end and releases
        what it held (its sessions stay)."""
        current = self.generation()
        stale = [
            connection
            for connection in self.by_id.values()
            if connection.generation != current and not connection.channel.closed
        ]
        if not stale:
            return
        logger.info(
            "ending %d network connection(s) admitted under a token no longer in force",
            len(stale),
        )
        for connection in stale:
            connection.channel.close()
