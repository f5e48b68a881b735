"""The stdlib-only stdio <-> Unix-socket bridge between an ACP client and a running host.

This package must never import ``trio``, ``click`` or ``maple_acp``: it is what an ACP client
spawns for every session, so its start-up cost is the client's latency.
"""

from maple_acp_connector._version import __version__

__all__ = ["__version__"]
