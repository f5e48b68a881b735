"""The root of the library's exception tree.

``MapleAcpError`` is the base of every exception the library raises on purpose; each layer
derives its own errors from it, so a host can catch everything the library means to raise with
one clause and still tell the layers apart.
"""

from __future__ import annotations


class MapleAcpError(Exception):
    """Base of every exception ``maple_acp`` raises on purpose."""
