"""``maple-acp serve``: its options, how its settings are resolved and checked, and the
one-line failures it turns errors into. The host it runs is :mod:`maple_acp.cli._host`'s.

Output: nothing on stdout; the ready line, the stopped line and the logs go to stderr (as JSON
objects with ``--log-format json``); a refusal is one line on stderr and exit status 1.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import click

from maple_acp._groups import single_exception
from maple_acp._hardening import harden_host_process
from maple_acp.cli._engine import provider_engine
from maple_acp.cli._errors import CliError
from maple_acp.cli._host import (
    HostOptions,
    configure_logging,
    log_entry,
    open_default_host,
    raise_open_file_limit,
)
from maple_acp.cli._options import DATA_DIR_HELP, config_option, load_config_file
from maple_acp.config import (
    LOG_FORMATS,
    LOG_LEVEL_ENV,
    LOG_LEVELS,
    MAX_CONNECTIONS,
    MAX_GRACE_S,
    ConfigFile,
    PrivateDirectoryError,
    ServeSettings,
    SettingError,
    check_relay_names,
    make_private_dir,
    resolve_serve_settings,
)
from maple_acp_connector.endpoint import ENDPOINT_ENV, resolve_endpoint

logger = logging.getLogger("maple_acp.cli")

#: The line ``serve`` writes on stderr once clients can connect (tests and scripts wait for it).
READY_PREFIX: Final = "maple-acp: serving on "
#: How long the check for a service already at the endpoint waits (it is a local socket).
LIVE_PROBE_TIMEOUT_S: Final = 5.0


async def _serve(options: HostOptions, announce: Callable[[str], None]) -> None:
    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_default_host(options):
            announce(f"{READY_PREFIX}{options.endpoint}")
            async for signum in signals:
                logger.info("%s received; shutting down", signal.Signals(signum).name)
                break


def _prepare_endpoint(chosen: str | None) -> Path:
    """The endpoint, with its directory created 0700 (each missing component) or verified."""
    endpoint = resolve_endpoint(chosen, os.environ)
    try:
        make_private_dir(endpoint.parent, "socket directory")
    except PrivateDirectoryError as exc:
        raise CliError(str(exc)) from None
    return endpoint


def _refuse_live_endpoint(endpoint: Path) -> None:
    """Fail before opening the store when a service already answers at ``endpoint``.

    Only a courtesy (no store is opened, nothing is logged): binding is what decides, and it
    refuses a live endpoint again without a race.
    """
    if not endpoint.is_socket():
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(LIVE_PROBE_TIMEOUT_S)
        try:
            probe.connect(os.fspath(endpoint))
        except OSError:
            return
    raise CliError(f"another service is already listening at {endpoint}")


def _check_relay_names(
    ctx: click.Context, param: click.Parameter, names: Sequence[str]
) -> Sequence[str]:
    try:
        return check_relay_names(tuple(names))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@config_option
@click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    help=f"Listen on PATH (also: ${ENDPOINT_ENV}; config: socket).  "
    "[default: this installation's endpoint; `maple-acp status` shows it]",
)
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), help=DATA_DIR_HELP)
@click.option(
    "--allowed-root",
    "allowed_roots",
    multiple=True,
    metavar="DIR",
    help="Admit sessions only under DIR (repeatable; config: allowed_roots).  "
    "[default: any absolute directory]",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1, MAX_CONNECTIONS),
    default=None,
    help=f"Simultaneous ACP connections (config: max_connections).  [default: {MAX_CONNECTIONS}]",
)
@click.option(
    "--protocol-max",
    type=click.IntRange(1, 2),
    default=None,
    help="The newest ACP version a client may get; 1 pins every client to v1 "
    "(config: protocol_max).  [default: 2]",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0, max=MAX_GRACE_S),
    default=None,
    metavar="SECONDS",
    help="How long a never-prompted session survives a disconnect; 0 deletes it at once "
    "(config: grace).  [default: 600]",
)
@click.option(
    "--relay-allow",
    multiple=True,
    metavar="NAME",
    callback=_check_relay_names,
    help="An environment variable name the connector may relay to shell tools "
    "(repeatable; config: relay_allow).",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default=None,
    help=f"Log detail on stderr (also: ${LOG_LEVEL_ENV}; config: log_level).  [default: info]",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default=None,
    help="text, or json for one JSON object per line (config: log_format).  [default: text]",
)
@click.option(
    "--provider-url",
    metavar="URL",
    help="Use the OpenAI-compatible Chat Completions endpoint URL (e.g. "
    "http://localhost:11434/v1) instead of the demo engine or the config file's providers; "
    "needs --model.",
)
@click.option(
    "--model", metavar="ID", help="The model at --provider-url (clients see provider/ID)."
)
@click.option(
    "--api-key-env",
    metavar="NAME",
    help="The NAME of the environment variable holding the API key for --provider-url "
    "(read once at start; the key itself is never a flag).",
)
@click.option(
    "--provider-kind",
    metavar="KIND",
    default=None,
    help="The engine kind --provider-url speaks: openai (Chat Completions), anthropic (the "
    "Messages API, e.g. https://api.anthropic.com/v1), or an installed engine's kind.  "
    "[default: openai]",
)
@click.option(
    "--http",
    "http_listen",
    metavar="HOST:PORT",
    help="Also serve ACP over WebSocket and Streamable HTTP at http://HOST:PORT/acp "
    "(config: [http] listen). HOST is an IP address or localhost, not a host name "
    "(127.0.0.1:8765, [::1]:8765 for IPv6; any other address needs --tls-cert and --tls-key; "
    "PORT 0 picks a free one); a name clients use goes in --http-allowed-host. Clients "
    "need the token `maple-acp http-token` prints (give it serve's --data-dir and --config).  "
    "[default: off]",
)
@click.option(
    "--tls-cert",
    "http_tls_cert",
    metavar="PATH",
    help="TLS certificate for --http; needed for an address other than loopback "
    "(config: [http] tls_cert).",
)
@click.option(
    "--tls-key",
    "http_tls_key",
    metavar="PATH",
    help="TLS private key for --http (config: [http] tls_key).",
)
@click.option(
    "--http-allowed-origin",
    "http_allowed_origins",
    multiple=True,
    metavar="ORIGIN",
    help="A browser origin (https://ide.example) allowed to call --http (repeatable; "
    "config: [http] allowed_origins).  [default: none]",
)
@click.option(
    "--http-allowed-host",
    "http_allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A name the Host header may carry besides the bind address and localhost, e.g. a "
    "reverse proxy's (repeatable; config: [http] allowed_hosts).",
)
def serve(
    config_path: Path | None,
    socket_path: str | None,
    data_dir: Path | None,
    allowed_roots: Sequence[str],
    max_connections: int | None,
    protocol_max: int | None,
    grace: float | None,
    relay_allow: Sequence[str],
    log_level: str | None,
    log_format: str | None,
    provider_url: str | None,
    model: str | None,
    api_key_env: str | None,
    provider_kind: str | None,
    http_listen: str | None,
    http_tls_cert: str | None,
    http_tls_key: str | None,
    http_allowed_origins: Sequence[str],
    http_allowed_hosts: Sequence[str],
) -> None:
    """Run the agent runtime and the ACP service until SIGINT or SIGTERM.

    Each setting comes from its flag, else the environment, else the config file, else the
    default.
    """
    # First: the environment may hold a provider key, and the tool children run as this user.
    hardened = harden_host_process()
    config = load_config_file(config_path)
    try:
        settings = resolve_serve_settings(
            {
                "socket": socket_path,
                "data_dir": os.path.abspath(data_dir) if data_dir is not None else None,
                "allowed_roots": tuple(allowed_roots),
                "max_connections": max_connections,
                "protocol_max": protocol_max,
                "grace": grace,
                "relay_allow": tuple(relay_allow),
                "log_level": log_level.lower() if log_level else None,
                "log_format": log_format,
                "http_listen": http_listen,
                "http_tls_cert": _absolute(http_tls_cert),
                "http_tls_key": _absolute(http_tls_key),
                "http_allowed_origins": tuple(http_allowed_origins),
                "http_allowed_hosts": tuple(http_allowed_hosts),
            },
            os.environ,
            config,
        )
    except SettingError as exc:
        raise CliError(str(exc)) from None
    configure_logging(settings.log_level, settings.log_format)
    raise_open_file_limit()
    if hardened:
        # DEBUG: a refusal below must stay the one line on stderr.
        logger.debug("the host process is not dumpable: the processes it starts cannot read it")
    try:
        _serve_with(settings, config, (provider_url, model, api_key_env), provider_kind)
    except CliError as exc:
        exc.as_json = settings.log_format == "json"
        raise


def _absolute(path: str | None) -> str | None:
    return os.path.abspath(os.path.expanduser(path)) if path is not None else None


def _network_settings(settings: ServeSettings, data_dir: Path) -> Any:
    """The network listener's settings (``None`` when it is off), checked now: a refusal is
    one line before anything starts."""
    if settings.http_listen is None:
        return None
    from maple_acp.net import HttpSetupError, NetworkSettings, parse_listen

    try:
        host, port = parse_listen(settings.http_listen)
    except ValueError as exc:
        raise CliError(f"--http ([http] listen): {exc}") from None
    network = NetworkSettings(
        host=host,
        port=port,
        data_dir=data_dir,
        tls_cert=Path(settings.http_tls_cert) if settings.http_tls_cert else None,
        tls_key=Path(settings.http_tls_key) if settings.http_tls_key else None,
        allowed_origins=settings.http_allowed_origins,
        allowed_hosts=settings.http_allowed_hosts,
    )
    try:
        network.check()
        network.check_server_installed()
    except HttpSetupError as exc:
        raise CliError(str(exc)) from None
    return network


def _announce(log_format: str) -> Callable[[str], None]:
    """How ``serve`` writes its ready and stopped lines: plain, or as JSON log objects."""
    if log_format == "json":
        return lambda line: click.echo(
            json.dumps(log_entry("info", "maple_acp.cli", line)), err=True
        )
    return lambda line: click.echo(line, err=True)


def _serve_with(
    settings: ServeSettings,
    config: ConfigFile,
    provider_flags: tuple[str | None, str | None, str | None],
    provider_kind: str | None = None,
) -> None:
    for root in settings.allowed_roots:
        if not os.path.isabs(root) or not os.path.isdir(root):
            raise CliError(
                f"an allowed root (--allowed-root, allowed_roots) must be an existing absolute "
                f"directory: {root!r}"
            )
    engine = provider_engine(config, *provider_flags, settings.tool_env_allow, provider_kind)
    endpoint = _prepare_endpoint(settings.socket)
    _refuse_live_endpoint(endpoint)
    try:
        directory = make_private_dir(settings.data_dir, "data directory")
    except PrivateDirectoryError as exc:
        raise CliError(str(exc)) from None
    network = _network_settings(settings, directory)
    from maple_acp.edge import ConfigError, ListenerError
    from maple_acp.net import HttpSetupError
    from maple_acp.store import DataDirectoryLocked

    announce = _announce(settings.log_format)
    options = HostOptions(
        endpoint=endpoint,
        data_dir=directory,
        allowed_roots=settings.allowed_roots,
        max_connections=settings.max_connections,
        protocol_max=settings.protocol_max,
        provisional_grace_s=settings.grace,
        relay_allow=frozenset(settings.relay_allow),
        tool_env_allow=frozenset(settings.tool_env_allow),
        subagent_model=settings.subagent_model,
        engine=engine,
        network=network,
    )
    import trio

    try:
        trio.run(_serve, options, announce)
    except BaseException as exc:
        inner = single_exception(exc)
        if isinstance(inner, ListenerError | ConfigError | DataDirectoryLocked | HttpSetupError):
            raise CliError(str(inner)) from None
        if isinstance(inner, OSError) and network is not None:
            where = settings.http_listen
            raise CliError(f"cannot serve --http on {where}: {inner.strerror}") from None
        raise
    announce("maple-acp: stopped")
