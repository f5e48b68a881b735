"""The one failure every ``maple-acp`` command reports: ``CliError``, a single ``maple-acp: ...``
line on stderr and exit status 1.

Every command module raises it and ``doctor`` turns it into a failed check, so it lives here,
below all of them: a command module never imports another command module for its error.
"""

from __future__ import annotations

import json
from typing import Any

import click

from maple_acp.cli._host import log_entry

__all__ = ["CliError"]


class CliError(click.ClickException):
    """A failure reported as one ``maple-acp: ...`` line on stderr with exit status 1."""

    exit_code = 1
    #: Set by ``serve --log-format json``: the line is then a JSON object like every log line.
    as_json = False

    def show(self, file: Any = None) -> None:
        if self.as_json:
            click.echo(
                json.dumps(log_entry("error", "maple_acp.cli", self.format_message())), err=True
            )
        else:
            click.echo(f"maple-acp: {self.format_message()}", err=True)
