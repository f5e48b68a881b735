"""The one shape every listener has, and what a listener asks of the ACP service it serves.

A listener is a way in for ACP clients (the owner-only Unix socket, the network). Whatever it
listens on, it is run the same way, the way trio runs long-lived things::

    address = await nursery.start(listener.serve, host)

- **started in a nursery**: ``serve`` runs until cancelled, in the nursery it is started in;
  every connection it accepts lives in a nursery of its own inside it;
- **readiness reported**: ``task_status.started(address)`` once clients can connect, with
  where they connect (the socket's path, the URL); a setting or an endpoint it refuses raises
  before that, so ``nursery.start`` raises it and nothing listens;
- **stopped within the deadline**: cancelling it stops accepting at once and ends its
  connections, each within its own cleanup deadline (``maple_acp.edge.DISCONNECT_CLEANUP_S``);
  what it bound is released before it returns.

Each accepted connection takes one of the host's connection slots (:meth:`ConnectionHost.
try_admit`, the limit every listener counts in) and is handed to the host's ``serve_stream``
as a trio stream (the socket: the peer frames lines) or a message transport (the network: whole
messages with their route): the listener knows the transport, never the protocol.
"""

from __future__ import annotations

from typing import Protocol

import trio

from maple_acp.rpc import MessageTransport


class ConnectionHost(Protocol):
    """What a listener needs of the ACP service (``maple_acp.edge.AcpService`` is one)."""

    def try_admit(self) -> bool:
        """Take a connection slot; ``False`` when every slot is in use (one count for every
        listener)."""

    def release(self) -> None:
        """Give a slot taken with :meth:`try_admit` back."""

    async def serve_stream(self, stream: trio.abc.Stream | MessageTransport) -> None:
        """Serve one ACP connection over ``stream`` until it ends."""

    async def session_exists(self, session_id: str) -> bool:
        """Whether a session by this id exists for the host's account (open or stored): a
        transport that names sessions in its addressing asks before it routes."""


class Listener(Protocol):
    """A way in for ACP clients, in the shape the module docstring describes
    (:class:`~maple_acp.listeners.UnixListener`, ``maple_acp.net.NetworkListener``)."""

    async def serve(
        self,
        host: ConnectionHost,
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen, hand each admitted connection to ``host`` and report where clients
        connect; until cancelled."""
