"""Lease-scoped transient MCP: definition checks, the router, and the ``external_mcp`` tool.

A server is reached over loopback HTTP, or, when it lives in the client, through ``mcp/message``
requests on the connection that declared it (an :class:`McpMessageChannel` the edge supplies).

A lease validates the client's definitions with :func:`validate_servers`, starts an
:class:`McpRouter` in its own nursery, hands :meth:`McpRouter.tool_definition` to the backend,
routes ``external_mcp`` calls through :meth:`McpRouter.call`, and revokes it synchronously with
:meth:`McpRouter.revoke` on close, disconnect or lease loss.

The router (and the MCP SDK under it) is imported on first use, not with this package: a host
whose sessions bring no MCP servers never pays for it.
"""

from typing import TYPE_CHECKING, Any, Final

from maple_acp.mcp._catalog import (
    EXTERNAL_MCP_TOOL_NAME,
    MAX_CATALOG_BYTES,
    MAX_CATALOG_PAGES,
    MAX_RESULT_BYTES,
    MAX_TOOL_BYTES,
    MAX_TOOL_ID_BYTES,
    MAX_TOOLS_PER_SERVER,
    MAX_TOOLS_TOTAL,
    ExternalToolDefinition,
    FrozenTool,
)
from maple_acp.mcp._definitions import (
    MAX_HEADER_BYTES_PER_SERVER,
    MAX_HEADER_VALUE_BYTES,
    MAX_NAME_CHARS,
    MAX_SERVER_ID_CHARS,
    MAX_SERVERS,
    RESERVED_HEADER_NAMES,
    RESERVED_HEADER_PREFIXES,
    AcpMcpServer,
    HttpMcpServer,
    McpServerDefinition,
    SseMcpServer,
    StdioMcpServer,
    ValidatedServer,
    normalise_key,
    validate_servers,
)
from maple_acp.mcp._errors import (
    ExternalMcpError,
    ExternalToolError,
    McpDefinitionError,
    McpSetupError,
)

if TYPE_CHECKING:
    from maple_acp.mcp._acp_stream import McpMessageChannel
    from maple_acp.mcp._router import (
        CALL_TIMEOUT_SECONDS,
        REVOKED_MESSAGE,
        SESSION_CLOSE_TIMEOUT_SECONDS,
        SETUP_TIMEOUT_SECONDS,
        McpRouter,
    )

#: Names served by ``_router``, which imports the MCP SDK (most of a host's start-up time):
#: it is loaded only when something asks for one, i.e. when a session brings MCP servers.
_ROUTER_NAMES: Final = frozenset(
    {
        "CALL_TIMEOUT_SECONDS",
        "REVOKED_MESSAGE",
        "SESSION_CLOSE_TIMEOUT_SECONDS",
        "SETUP_TIMEOUT_SECONDS",
        "McpRouter",
    }
)


def __getattr__(name: str) -> Any:
    if name in _ROUTER_NAMES:
        from maple_acp.mcp import _router

        return getattr(_router, name)
    if name == "McpMessageChannel":
        from maple_acp.mcp import _acp_stream

        return _acp_stream.McpMessageChannel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CALL_TIMEOUT_SECONDS",
    "EXTERNAL_MCP_TOOL_NAME",
    "MAX_CATALOG_BYTES",
    "MAX_CATALOG_PAGES",
    "MAX_HEADER_BYTES_PER_SERVER",
    "MAX_HEADER_VALUE_BYTES",
    "MAX_NAME_CHARS",
    "MAX_RESULT_BYTES",
    "MAX_SERVERS",
    "MAX_SERVER_ID_CHARS",
    "MAX_TOOLS_PER_SERVER",
    "MAX_TOOLS_TOTAL",
    "MAX_TOOL_BYTES",
    "MAX_TOOL_ID_BYTES",
    "RESERVED_HEADER_NAMES",
    "RESERVED_HEADER_PREFIXES",
    "REVOKED_MESSAGE",
    "SESSION_CLOSE_TIMEOUT_SECONDS",
    "SETUP_TIMEOUT_SECONDS",
    "AcpMcpServer",
    "ExternalMcpError",
    "ExternalToolDefinition",
    "ExternalToolError",
    "FrozenTool",
    "HttpMcpServer",
    "McpDefinitionError",
    "McpMessageChannel",
    "McpRouter",
    "McpServerDefinition",
    "McpSetupError",
    "SseMcpServer",
    "StdioMcpServer",
    "ValidatedServer",
    "normalise_key",
    "validate_servers",
]
