"""The exceptions of the transient MCP router, in one hierarchy.

Every message is one bounded line that names servers by position and name only: header values,
URLs and anything a server could have copied from them never appear in it.
"""

from __future__ import annotations

from maple_acp._exceptions import MapleAcpError
from maple_acp._text import one_line


class ExternalMcpError(MapleAcpError):
    """Base of every error raised by :mod:`maple_acp.mcp`; ``message`` is safe to show a client."""

    def __init__(self, message: str) -> None:
        self.message = one_line(message)
        super().__init__(self.message)


class McpDefinitionError(ExternalMcpError):
    """A client-supplied MCP server definition was refused before anything started."""


class McpSetupError(ExternalMcpError):
    """Connecting to the servers or discovering their catalogs failed; nothing stays running."""


class ExternalToolError(ExternalMcpError):
    """One ``external_mcp`` call failed; the router stays usable unless it was revoked.

    ``notice``, when set, is one safe line the user should see about the session as a whole
    (a server that dropped its MCP session), beside the call's own failure."""

    def __init__(self, message: str, *, notice: str | None = None) -> None:
        super().__init__(message)
        self.notice = notice
