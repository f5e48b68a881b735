"""The network listener's one exception."""

from __future__ import annotations

from maple_acp._exceptions import MapleAcpError


class HttpSetupError(MapleAcpError):
    """The network listener cannot start as configured (one line, safe to show: never the
    token): a non-loopback address without TLS, a missing extra, an unusable token file."""
