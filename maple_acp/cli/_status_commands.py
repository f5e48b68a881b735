"""``maple-acp status`` and ``maple-acp http-token``: what the running host says about
itself (its counters, its engine, the token file its network listener reads), asked over the
socket with the standard library only.

Output: the report (or the token) on stdout; a failure is one line on stderr and exit status
1 (``status --json`` prints its JSON object on stdout either way).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import click

from maple_acp.cli._client import HostUnavailable, host_status, printable
from maple_acp.cli._errors import CliError
from maple_acp.cli._options import (
    DATA_DIR_HELP,
    config_option,
    host_endpoint,
    load_config_file,
    socket_query_option,
)
from maple_acp.config import (
    PrivateDirectoryError,
    SettingError,
    make_private_dir,
    resolve_serve_settings,
)
from maple_acp_connector.endpoint import resolve_endpoint

#: ``status`` gives up on a service that does not answer within this (it is a local socket).
STATUS_TIMEOUT_S: Final = 5.0
#: A status answer is a few hundred bytes; anything longer is not one.
MAX_STATUS_BYTES: Final = 64 * 1024


def query_status(endpoint: Path, *, timeout: float = STATUS_TIMEOUT_S) -> dict[str, Any]:
    """Ask the service at ``endpoint`` for ``_maple/status``; raise :class:`CliError` with
    one line when there is none or it does not answer."""
    try:
        return host_status(endpoint, timeout=timeout, max_bytes=MAX_STATUS_BYTES)
    except HostUnavailable as exc:
        raise CliError(str(exc)) from None


def format_status(status: Mapping[str, Any]) -> str:
    connections = status.get("connections", 0)
    lines = [
        f"maple-acp service running at {status.get('endpoint')}",
        f"  signed in:    {'yes' if status.get('signedIn') else 'no'}",
        f"  connections:  {connections} (this query included)",
        f"  sessions:     {status.get('sessions', 0)}",
        f"  active runs:  {status.get('activeRuns', 0)}",
        f"  leases:       {status.get('leases', 0)} (sessions a client holds open)",
    ]
    engine = status.get("engine")
    if isinstance(engine, Mapping):
        lines.append(f"  backend:      {engine.get('backend')}")
        lines.append(f"  model:        {engine.get('defaultModel')} (the default)")
        for provider in engine.get("providers") or ():
            lines.append(f"  provider:     {_provider_line(provider)}")
        if isinstance(engine.get("http"), str):
            lines.append(f"  network:      {printable(engine['http'])} (WebSocket and HTTP)")
        if isinstance(engine.get("httpTokenFile"), str):
            lines.append(f"  token file:   {printable(engine['httpTokenFile'])}")
    return "\n".join(lines)


def _provider_line(provider: Mapping[str, Any]) -> str:
    """One provider's check as ``status`` prints it (the host's text is shown as printable)."""
    text = f"{provider.get('name')} at {provider.get('address')}: {provider.get('state')}"
    if isinstance(provider.get("models"), int):
        count = provider["models"]
        text += f", {count} model{'' if count == 1 else 's'} listed"
    if provider.get("detail"):
        text += f" ({provider['detail']})"
    return printable(text)


@click.command()
@socket_query_option
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, host or not.")
def status(socket_path: str | None, config_path: Path | None, as_json: bool) -> None:
    """Tell whether a service answers on this installation's endpoint, and its counters.

    Exit status 0 when a host answered, 1 when none did. With --json the answer is always
    one JSON object on stdout: "running" says which, "reason" says why not.
    """
    endpoint: Path | None = None
    try:
        endpoint = host_endpoint(socket_path, config_path)
        result = query_status(endpoint)
    except CliError as exc:
        if not as_json:
            raise
        # Even a config file that cannot be read is a JSON answer: monitors parse every run.
        where = os.fspath(endpoint) if endpoint is not None else None
        report = {"running": False, "endpoint": where, "reason": exc.message}
        click.echo(json.dumps(report, sort_keys=True))
        sys.exit(1)
    if as_json:
        click.echo(json.dumps({"running": True, **result}, sort_keys=True))
    else:
        click.echo(format_status(result))


@click.command("http-token")
@config_option
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help=DATA_DIR_HELP.replace(
        "Directory of the session store",
        "The data directory `serve` uses: the token is its http-token file",
        1,
    ),
)
@socket_query_option
@click.option(
    "--rotate",
    is_flag=True,
    help="Replace the token: clients with the old one get 401, and a running host ends their "
    "connections within a second.",
)
def http_token(
    config_path: Path | None, data_dir: Path | None, socket_path: str | None, rotate: bool
) -> None:
    """Print the bearer token clients of `serve --http` send (created on first use, 0600).

    The token file is <data dir>/http-token, the data directory resolved as `serve` resolves
    it (--data-dir, $MAPLE_ACP_DATA_DIR, the config file's data_dir): give the same flags as
    `serve`. When a host answers on the endpoint with its network listener on and reads
    another token file, this refuses, naming both. `maple-acp status` names the file a
    running host reads.

    Clients send it as `Authorization: Bearer TOKEN`, or a browser's WebSocket as the
    subprotocol `acp.bearer.TOKEN`. A running host takes a rotated token at once and ends the
    connections the old one admitted.
    """
    config = load_config_file(config_path)
    try:
        settings = resolve_serve_settings(
            {
                "socket": socket_path,
                "data_dir": os.path.abspath(data_dir) if data_dir is not None else None,
            },
            os.environ,
            config,
        )
    except SettingError as exc:
        raise CliError(str(exc)) from None
    from maple_acp.net import HttpSetupError, read_or_create_token, rotate_token, token_path

    path = token_path(Path(settings.data_dir))
    _refuse_another_hosts_token(resolve_endpoint(settings.socket, os.environ), path)
    try:
        directory = make_private_dir(settings.data_dir, "data directory")
    except PrivateDirectoryError as exc:
        raise CliError(str(exc)) from None
    existed = path.exists()
    try:
        token = rotate_token(directory) if rotate else read_or_create_token(directory)
    except HttpSetupError as exc:
        raise CliError(str(exc)) from None
    if not existed:
        # Never silent: a token made in a data directory `serve` does not use admits no one.
        click.echo(f"maple-acp: created a new token in {path}", err=True)
    click.echo(token)


def _refuse_another_hosts_token(endpoint: Path, path: Path) -> None:
    """Fail when the host answering at ``endpoint`` serves the network with a token file other
    than ``path``: the token printed would not be the one it checks. No host, or one without
    the network listener, is no conflict."""
    try:
        answer = host_status(endpoint, timeout=STATUS_TIMEOUT_S, max_bytes=MAX_STATUS_BYTES)
    except HostUnavailable:
        return
    engine = answer.get("engine")
    served = engine.get("httpTokenFile") if isinstance(engine, Mapping) else None
    if not isinstance(served, str) or os.path.realpath(served) == os.path.realpath(path):
        return
    raise CliError(
        f"the host at {endpoint} reads its token from {printable(served)}, not {path}: give "
        "http-token the same --data-dir and --config as serve (or --socket for another host)"
    )
