"""The ways in for ACP clients, in one shape: :class:`Listener`.

A host starts each listener it wants in its nursery, through its ACP service
(``await acp.listen(nursery, listener)``, which ``acp.stop()`` ends: the service keeps its
listeners in a :class:`RunningListeners`, which starts and stops them) or on its own
(``await nursery.start(listener.serve, acp)``). :class:`UnixListener` is the owner-only Unix
socket the connector reaches; ``maple_acp.net.NetworkListener`` (WebSocket and Streamable
HTTP) stands beside it in its own package, which loads the HTTP stack only once it serves.
Both hand each connection to the service's ``serve_stream`` (:class:`ConnectionHost`), take
one of its connection slots, and accept through :class:`AcceptRetry`.
"""

from maple_acp.listeners._accept import (
    ACCEPT_RETRY_S,
    REPORT_WINDOW_S,
    TRANSIENT_ACCEPT_ERRNOS,
    AcceptRetry,
    RepeatReport,
)
from maple_acp.listeners._running import RunningListeners
from maple_acp.listeners._shape import ConnectionHost, Listener
from maple_acp.listeners._unix import (
    LISTEN_BACKLOG,
    EndpointInUse,
    ListenerError,
    UnixListener,
)

__all__ = [
    "ACCEPT_RETRY_S",
    "LISTEN_BACKLOG",
    "REPORT_WINDOW_S",
    "TRANSIENT_ACCEPT_ERRNOS",
    "AcceptRetry",
    "ConnectionHost",
    "EndpointInUse",
    "Listener",
    "ListenerError",
    "RepeatReport",
    "RunningListeners",
    "UnixListener",
]
