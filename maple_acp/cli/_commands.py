"""The ``maple-acp`` command group (click): ``acp``, ``doctor`` and ``demo`` here, the others
each in a module of its own beside it. ``acp`` and ``--version`` never reach this package.

``serve`` (``_serve_command``) runs the runtime and the ACP service on the embedded defaults
(SQLite under the user data directory, the demo backend or a configured provider, the local
OS account) until SIGINT or SIGTERM; its settings follow :mod:`maple_acp.config` (flags >
environment > config file > defaults). ``status`` and ``http-token`` (``_status_commands``) ask
a running service for its counters, and print the network listener's token. ``sessions``
(``_sessions_command``) lists, shows and deletes the running host's sessions as an ACP client
of it. ``doctor`` checks the installation. ``demo`` runs a service in this process and drives a
short session through a real connector subprocess, printing the conversation.

A command module holds the command surface: each command's options, defaults and help, and
the one-line failures it turns errors into; the options several commands share are
``_options``'. What the commands run lives beside them: the host in ``_host``, the provider
engine built from settings in ``_engine``, the blocking ACP client of ``status``, ``sessions``
and ``demo`` in ``_client``, the checks of ``doctor`` in ``_doctor``, the demo's script in
``_demo``, and the one error they all raise in ``_errors``. A command module never imports
another; this group gathers them.

Output rules: ``serve`` writes nothing to stdout (its ready line and its logs go to stderr);
``status``, ``sessions`` and ``demo`` print their report on stdout; every failure is one line
on stderr and exit status 1 (``status --json`` also prints its JSON object on stdout).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from maple_acp._groups import single_exception
from maple_acp.cli._client import AcpCallError, HostUnavailable
from maple_acp.cli._errors import CliError
from maple_acp.cli._host import configure_logging
from maple_acp.cli._options import CONTEXT_SETTINGS, config_option, socket_query_option
from maple_acp.cli._serve_command import READY_PREFIX, serve
from maple_acp.cli._sessions_command import sessions
from maple_acp.cli._status_commands import format_status, http_token, query_status, status
from maple_acp.config import LOG_LEVELS
from maple_acp_connector import __version__
from maple_acp_connector.endpoint import ENDPOINT_ENV, resolve_endpoint

__all__ = ["READY_PREFIX", "cli", "format_status", "query_status"]


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", "-V", message="maple-acp %(version)s")
def cli() -> None:
    """Expose this host's agent runtime to ACP clients.

    ACP clients run `maple-acp acp` (the stdio connector); `serve` must be running.
    """


@cli.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.pass_context
def acp(ctx: click.Context) -> None:
    """The stdio connector ACP clients run: bridges stdin/stdout to the running host."""
    # `maple-acp acp` takes the fast path in _main before click is imported; this entry only
    # lists it in --help and serves callers that invoke the click group directly.
    from maple_acp_connector.__main__ import main as connector_main

    ctx.exit(connector_main(list(ctx.args), prog="maple-acp acp"))


# -- doctor -------------------------------------------------------------------------------------


@cli.command()
@socket_query_option
@config_option
@click.option(
    "--data-dir", type=click.Path(file_okay=False, path_type=Path), help="Check DIR as serve's."
)
def doctor(socket_path: str | None, config_path: Path | None, data_dir: Path | None) -> None:
    """Check this installation (config, endpoint, data directory, providers, connector) and
    print client settings to paste. One line per check; exit status 1 if any failed."""
    from maple_acp.cli._doctor import (
        DoctorInputs,
        client_settings,
        maple_acp_command,
        run_checks,
    )

    inputs = DoctorInputs(config_path=config_path, socket_path=socket_path, data_dir=data_dir)
    checks, endpoint = run_checks(inputs, os.environ)
    for check in checks:
        click.echo(check.line())
    click.echo("")
    default = resolve_endpoint(None, {k: v for k, v in os.environ.items() if k != ENDPOINT_ENV})
    for line in client_settings(maple_acp_command(), endpoint, default):
        click.echo(line)
    if not all(check.ok for check in checks):
        sys.exit(1)


# -- demo ---------------------------------------------------------------------------------------


@cli.command()
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="warning", show_default=True)
def demo(log_level: str) -> None:
    """Run a service in this process and a scripted session through a real connector."""
    configure_logging(log_level)
    import trio

    from maple_acp.cli._demo import DEMO_DEADLINE_S, demo_main

    connector = [sys.executable, "-m", "maple_acp_connector"]
    try:
        trio.run(demo_main, connector, click.echo)
    except BaseException as exc:
        inner = single_exception(exc)
        if isinstance(inner, KeyboardInterrupt):
            raise
        if isinstance(inner, trio.TooSlowError):
            raise CliError(f"the demo did not finish within {DEMO_DEADLINE_S:.0f} s") from None
        if isinstance(inner, HostUnavailable | AcpCallError):
            raise CliError(f"the demo failed: {inner}") from None
        raise


for _command in (serve, status, http_token, sessions):
    cli.add_command(_command)
