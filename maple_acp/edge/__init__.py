"""The ACP edge: the only place where the Agent Client Protocol meets the runtime.

``AcpService(runtime, config)`` serves ACP through the listeners a host starts with
:meth:`AcpService.listen` (``maple_acp.listeners``: the owner-only Unix socket, which
:meth:`AcpService.start` starts and remembers; ``maple_acp.net``: the network), stdio
(:meth:`AcpService.serve_stdio`) or any Trio stream (:meth:`AcpService.serve_stream`).
:class:`HostLifecycle` stops it before the runtime. ``ListenerError`` and ``EndpointInUse``
are the Unix listener's, named here too for the hosts that catch them from this package.
"""

from maple_acp.edge._bounds import MAX_RAW_BYTES, MAX_TOOL_TEXT_CHARS
from maple_acp.edge._closing import CLOSE_DEADLINE_S
from maple_acp.edge._config import (
    MAX_CONNECTIONS_LIMIT,
    AcpServiceConfig,
    ConfigError,
    PersistedServiceState,
    ServiceStateFile,
)
from maple_acp.edge._connection import DISCONNECT_CLEANUP_S
from maple_acp.edge._lifecycle import HostLifecycle, ShutdownReport
from maple_acp.edge._service import (
    PROTOCOL_VERSION,
    STOP_DEADLINE_S,
    AcpService,
    AcpServiceStatus,
    ConnectionView,
)
from maple_acp.listeners import EndpointInUse, ListenerError
from maple_acp.wire import STATUS_METHOD

__all__ = [
    "CLOSE_DEADLINE_S",
    "DISCONNECT_CLEANUP_S",
    "MAX_CONNECTIONS_LIMIT",
    "MAX_RAW_BYTES",
    "MAX_TOOL_TEXT_CHARS",
    "PROTOCOL_VERSION",
    "STATUS_METHOD",
    "STOP_DEADLINE_S",
    "AcpService",
    "AcpServiceConfig",
    "AcpServiceStatus",
    "ConfigError",
    "ConnectionView",
    "EndpointInUse",
    "HostLifecycle",
    "ListenerError",
    "PersistedServiceState",
    "ServiceStateFile",
    "ShutdownReport",
]
