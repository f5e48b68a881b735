"""ACP over the network: WebSocket and Streamable HTTP at ``/acp``, for browser-based and
remote clients, beside the owner-only Unix socket (which stays the default).

:class:`NetworkListener` is a listener in the shape of the Unix socket's
(``maple_acp.listeners.Listener``: ``await acp.listen(nursery, NetworkListener(settings))``);
:func:`serve_network`, what it runs, serves hypercorn's Trio worker inside the caller's nursery;
every network connection is served by the host's ACP service (:class:`NetworkHost`) exactly
like a socket connection, over a :class:`NetworkChannel`. Requests are admitted by a bearer token
(:func:`read_or_create_token`, :func:`rotate_token`), a ``Host`` allow-list and an ``Origin``
allow-list. This package knows the transport, never the ACP methods' meaning.
"""

from maple_acp.net._app import AcpNetworkApp
from maple_acp.net._asgi import ACP_PATH
from maple_acp.net._channel import NetworkChannel
from maple_acp.net._connections import (
    IDLE_CONNECTION_S,
    RESUME_WINDOW_S,
    SSE_KEEPALIVE_S,
    NetworkHost,
    NetworkLimits,
)
from maple_acp.net._errors import HttpSetupError
from maple_acp.net._guard import (
    MAX_AUTH_FAILURES_PER_S,
    GuardPolicy,
    RequestGuard,
    origin_problem,
)
from maple_acp.net._server import (
    INSTALL_HINT,
    NetworkListener,
    NetworkSettings,
    parse_listen,
    serve_network,
)
from maple_acp.net._token import (
    TOKEN_FILE_NAME,
    TokenFile,
    read_or_create_token,
    rotate_token,
    token_path,
)

__all__ = [
    "ACP_PATH",
    "IDLE_CONNECTION_S",
    "INSTALL_HINT",
    "MAX_AUTH_FAILURES_PER_S",
    "RESUME_WINDOW_S",
    "SSE_KEEPALIVE_S",
    "TOKEN_FILE_NAME",
    "AcpNetworkApp",
    "GuardPolicy",
    "HttpSetupError",
    "NetworkChannel",
    "NetworkHost",
    "NetworkLimits",
    "NetworkListener",
    "NetworkSettings",
    "RequestGuard",
    "TokenFile",
    "origin_problem",
    "parse_listen",
    "read_or_create_token",
    "rotate_token",
    "serve_network",
    "token_path",
]
