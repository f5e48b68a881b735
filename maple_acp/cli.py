"""The ``maple-acp`` command line (click). ``acp`` and ``--version`` never reach this module."""

from __future__ import annotations

import click

from maple_acp_connector._version import __version__


@click.group()
@click.version_option(__version__, "--version", "-V", message="maple-acp %(version)s")
def cli() -> None:
    """Expose this host's agent runtime to ACP clients."""
