"""Exceptions raised by the rpc layer itself.

An error *answer* from the remote side is a :class:`maple_acp.wire.ProtocolError`; the classes
here describe the connection and its limits, so that a caller can tell "the other side said no"
from "this connection is gone" from "this one frame cannot be sent".
"""

from __future__ import annotations

from maple_acp._exceptions import MapleAcpError


class RpcError(MapleAcpError):
    """Base class of every exception the rpc layer raises about the connection."""


class ConnectionClosed(RpcError):
    """The connection ended (EOF, transport failure, a fatal frame, or ``aclose``).

    Every outgoing request still waiting for its answer fails with this at the moment the
    connection ends; sending on a closed peer raises it at once.
    """


class FrameTooLong(RpcError):
    """An inbound line grew past the line cap. Fatal for the connection that sent it."""


class OutboundFrameTooLarge(RpcError):
    """One outbound frame costs more credit than the whole outbound budget.

    It could never be admitted, so it is refused at once. The connection is unaffected: the
    caller ends its own unit of work (a turn, a reply) instead of the connection.
    """
