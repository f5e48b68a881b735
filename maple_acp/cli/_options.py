"""What the ``maple-acp`` commands share: the group's context settings, the ``--config``,
``--data-dir`` and query ``--socket`` options, and reading the config file and the endpoint the
same way in every command. Each command module stands on this one and never on another command
module.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import click

from maple_acp.cli._errors import CliError
from maple_acp.config import (
    DATA_DIR_ENV,
    ConfigFile,
    ConfigFileError,
    default_config_file,
    default_data_dir,
    load_config,
    resolve_socket,
)
from maple_acp_connector.endpoint import ENDPOINT_ENV, resolve_endpoint

#: ``-h`` works everywhere (subcommands inherit the setting from the group).
CONTEXT_SETTINGS: Final[dict[str, Any]] = {"help_option_names": ["-h", "--help"]}

DATA_DIR_HELP: Final = (
    f"Directory of the session store (also: ${DATA_DIR_ENV}; config: data_dir).  "
    "[default: $XDG_DATA_HOME/maple-acp, else ~/.local/share/maple-acp; "
    f"here: {default_data_dir(os.environ)}]"
)
_CONFIG_HELP: Final = (
    "Read settings from PATH (TOML).  [default: $XDG_CONFIG_HOME/maple-acp/config.toml, else "
    f"~/.config/maple-acp/config.toml; here: {default_config_file(os.environ)}]"
)
config_option = click.option(
    "--config",
    "config_path",
    # Not click's own checks: load_config refuses anything but a regular file in one line.
    type=click.Path(path_type=Path),
    metavar="PATH",
    help=_CONFIG_HELP,
)
socket_query_option = click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    help=f"Ask the service at PATH (also: ${ENDPOINT_ENV}; config: socket).  "
    "[default: this installation's endpoint]",
)


def load_config_file(config_path: Path | None) -> ConfigFile:
    """The config file (``None``: the default one, if any); a refusal is one :class:`CliError`."""
    try:
        return load_config(config_path, os.environ)
    except ConfigFileError as exc:
        raise CliError(str(exc)) from None


def host_endpoint(socket_path: str | None, config_path: Path | None) -> Path:
    """The endpoint of the host to ask: ``--socket``, else the environment, else the config
    file, else this installation's."""
    chosen = resolve_socket(socket_path, os.environ, load_config_file(config_path))
    return resolve_endpoint(chosen, os.environ)
