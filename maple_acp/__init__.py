"""maple_acp: expose a host application's own agent runtime to ACP clients.

Importing this package is cheap: the public names below are loaded on first use, so that the
``maple-acp`` entry point and a host's UI can import it without pulling in the whole stack.
"""

from __future__ import annotations

from maple_acp_connector._version import __version__

__all__ = ["__version__"]
