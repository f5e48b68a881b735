"""The ``maple-acp`` command line: ``serve``, ``status``, ``sessions``, ``doctor``, ``demo``.

The console script enters at :func:`maple_acp._main.main`, which answers ``acp`` and
``--version`` itself before this package (and click, and trio) is imported; everything else
reaches the click group ``cli`` here.

Layout: ``_commands`` holds the group (and ``acp``, ``doctor``, ``demo``) and gathers the
command modules beside it, one a concern (``_serve_command``; ``_status_commands``: ``status``
and ``http-token``; ``_sessions_command``), which share only ``_options``; what they run sits
beside them (``_host``: the host ``serve`` and ``demo`` run; ``_engine``: the provider engine
built from settings; ``_client``: a blocking ACP client over the socket; ``_doctor``: the
installation checks; ``_demo``: the demo's script) and every one of them reports failure as
``_errors``' ``CliError``. A command module never imports another command module.
"""

from maple_acp.cli._commands import READY_PREFIX, cli, format_status, query_status
from maple_acp.cli._engine import provider_engine
from maple_acp.cli._errors import CliError
from maple_acp.cli._host import HostOptions, open_default_host
from maple_acp.config import default_data_dir

__all__ = [
    "READY_PREFIX",
    "CliError",
    "HostOptions",
    "cli",
    "default_data_dir",
    "format_status",
    "open_default_host",
    "provider_engine",
    "query_status",
]
