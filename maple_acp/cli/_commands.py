"""The ``maple-acp`` commands and their options (click). ``acp`` and ``--version`` never reach
this module.

``serve`` runs the runtime and the ACP service on the embedded defaults (SQLite under the
user data directory, the demo backend or a configured provider, the local OS account) until
SIGINT or SIGTERM; its settings follow :mod:`maple_acp.config` (flags > environment > config
file > defaults). ``status`` asks a running service for its counters over the socket with the
standard library only. ``sessions`` lists, shows and deletes the running host's sessions as an
ACP client of it. ``doctor`` checks the installation. ``demo`` runs a service in this process
and drives a short session through a real connector subprocess, printing the conversation.

This module is the command surface: each command's options, defaults and help, and the
one-line failures it turns errors into. What the commands run lives beside it: the host in
``_host``, the provider engine built from settings in ``_engine``, the blocking ACP client of
``status``, ``sessions`` and ``demo`` in ``_client``, the checks of ``doctor`` in ``_doctor``,
the demo's script in ``_demo``, and the one error they all raise in ``_errors``.

Output rules: ``serve`` writes nothing to stdout (its ready line and its logs go to stderr);
``status``, ``sessions`` and ``demo`` print their report on stdout; every failure is one line
on stderr and exit status 1 (``status --json`` also prints its JSON object on stdout).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import click

from maple_acp._groups import single_exception
from maple_acp._hardening import harden_host_process
from maple_acp.cli._client import (
    AcpCallError,
    HostUnavailable,
    LineClient,
    connect_host,
    host_status,
    initialize,
    list_sessions,
    printable,
    render_transcript,
)
from maple_acp.cli._engine import provider_engine
from maple_acp.cli._errors import CliError
from maple_acp.cli._host import (
    HostOptions,
    configure_logging,
    log_entry,
    open_default_host,
    raise_open_file_limit,
)
from maple_acp.config import (
    DATA_DIR_ENV,
    LOG_FORMATS,
    LOG_LEVEL_ENV,
    LOG_LEVELS,
    MAX_CONNECTIONS,
    MAX_GRACE_S,
    ConfigFile,
    ConfigFileError,
    PrivateDirectoryError,
    ServeSettings,
    SettingError,
    check_relay_names,
    default_config_file,
    default_data_dir,
    load_config,
    make_private_dir,
    resolve_serve_settings,
    resolve_socket,
)
from maple_acp_connector import __version__
from maple_acp_connector.endpoint import (
    ENDPOINT_ENV,
    resolve_endpoint,
)

__all__ = ["READY_PREFIX", "cli", "format_status", "query_status"]

logger = logging.getLogger("maple_acp.cli")

#: ``status`` gives up on a service that does not answer within this (it is a local socket).
STATUS_TIMEOUT_S: Final = 5.0
#: ``sessions`` gives up on a host that sends nothing for this long (a replay streams steadily).
SESSIONS_IDLE_TIMEOUT_S: Final = 30.0
#: A status answer is a few hundred bytes; anything longer is not one.
MAX_STATUS_BYTES: Final = 64 * 1024
#: The line ``serve`` writes on stderr once clients can connect (tests and scripts wait for it).
READY_PREFIX: Final = "maple-acp: serving on "

#: ``-h`` works everywhere (subcommands inherit the setting from the group).
CONTEXT_SETTINGS: Final[dict[str, Any]] = {"help_option_names": ["-h", "--help"]}


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
        probe.settimeout(STATUS_TIMEOUT_S)
        try:
            probe.connect(os.fspath(endpoint))
        except OSError:
            return
    raise CliError(f"another service is already listening at {endpoint}")


def _load_config(config_path: Path | None) -> ConfigFile:
    try:
        return load_config(config_path, os.environ)
    except ConfigFileError as exc:
        raise CliError(str(exc)) from None


def _check_relay_names(
    ctx: click.Context, param: click.Parameter, names: Sequence[str]
) -> Sequence[str]:
    try:
        return check_relay_names(tuple(names))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


# -- the command line ---------------------------------------------------------------------------


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


_DATA_DIR_HELP = (
    f"Directory of the session store (also: ${DATA_DIR_ENV}; config: data_dir).  "
    "[default: $XDG_DATA_HOME/maple-acp, else ~/.local/share/maple-acp; "
    f"here: {default_data_dir(os.environ)}]"
)
_CONFIG_HELP = (
    "Read settings from PATH (TOML).  [default: $XDG_CONFIG_HOME/maple-acp/config.toml, else "
    f"~/.config/maple-acp/config.toml; here: {default_config_file(os.environ)}]"
)
_config_option = click.option(
    "--config",
    "config_path",
    # Not click's own checks: load_config refuses anything but a regular file in one line.
    type=click.Path(path_type=Path),
    metavar="PATH",
    help=_CONFIG_HELP,
)


@cli.command()
@_config_option
@click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    help=f"Listen on PATH (also: ${ENDPOINT_ENV}; config: socket).  "
    "[default: this installation's endpoint; `maple-acp status` shows it]",
)
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), help=_DATA_DIR_HELP)
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
    config = _load_config(config_path)
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


# -- status -------------------------------------------------------------------------------------


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


_socket_query_option = click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    help=f"Ask the service at PATH (also: ${ENDPOINT_ENV}; config: socket).  "
    "[default: this installation's endpoint]",
)


def _host_endpoint(socket_path: str | None, config_path: Path | None) -> Path:
    chosen = resolve_socket(socket_path, os.environ, _load_config(config_path))
    return resolve_endpoint(chosen, os.environ)


@cli.command()
@_socket_query_option
@_config_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, host or not.")
def status(socket_path: str | None, config_path: Path | None, as_json: bool) -> None:
    """Tell whether a service answers on this installation's endpoint, and its counters.

    Exit status 0 when a host answered, 1 when none did. With --json the answer is always
    one JSON object on stdout: "running" says which, "reason" says why not.
    """
    endpoint: Path | None = None
    try:
        endpoint = _host_endpoint(socket_path, config_path)
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


# -- sessions -----------------------------------------------------------------------------------


@contextmanager
def _host_session(socket_path: str | None, config_path: Path | None) -> Iterator[LineClient]:
    """An initialized client of the running host; any failure becomes one :class:`CliError`."""
    endpoint = _host_endpoint(socket_path, config_path)
    try:
        with connect_host(endpoint, idle_timeout=SESSIONS_IDLE_TIMEOUT_S) as client:
            yield client
    except (HostUnavailable, AcpCallError) as exc:
        raise CliError(str(exc)) from None


@cli.command("http-token")
@_config_option
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help=_DATA_DIR_HELP.replace(
        "Directory of the session store",
        "The data directory `serve` uses: the token is its http-token file",
        1,
    ),
)
@_socket_query_option
@click.option("--rotate", is_flag=True, help="Replace the token: clients with the old one get 401.")
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
    subprotocol `acp.bearer.TOKEN`. A running host takes a rotated token at once.
    """
    config = _load_config(config_path)
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


@cli.group(context_settings=CONTEXT_SETTINGS)
def sessions() -> None:
    """List, show and delete the running host's sessions (as an ACP client of it)."""


@sessions.command("list")
@click.option("--cwd", metavar="DIR", help="Only sessions whose working directory is DIR.")
@click.option("--json", "as_json", is_flag=True, help='Print {"sessions": [...]} as JSON.')
@_socket_query_option
@_config_option
def sessions_list(
    cwd: str | None, as_json: bool, socket_path: str | None, config_path: Path | None
) -> None:
    """One line per session: id, last update, working directory, title."""
    with _host_session(socket_path, config_path) as client:
        initialize(client)
        found = list_sessions(client, os.path.abspath(cwd) if cwd else None)
    if as_json:
        click.echo(json.dumps({"sessions": found}, ensure_ascii=False))
        return
    if not found:
        click.echo("no sessions")
        return
    for item in found:
        title = f"  {printable(str(item['title']))}" if item.get("title") else ""
        cwd_text = printable(str(item.get("cwd", "")))
        click.echo(f"{item.get('sessionId')}  {item.get('updatedAt', '')}  {cwd_text}{title}")


@sessions.command("show")
@click.argument("session_id", metavar="ID")
@_socket_query_option
@_config_option
def sessions_show(session_id: str, socket_path: str | None, config_path: Path | None) -> None:
    """Print the transcript of session ID, as a load would replay it (read only: the session
    is not opened, so it may be open elsewhere, and its model need not be offered any more)."""
    from maple_acp.wire import TRANSCRIPT_METHOD

    with _host_session(socket_path, config_path) as client:
        initialize(client)
        match = [s for s in list_sessions(client) if s.get("sessionId") == session_id.strip()]
        if not match:
            raise CliError(f"no session {session_id!r} on this host (see: maple-acp sessions list)")
        info = match[0]
        try:
            client.request(TRANSCRIPT_METHOD, {"sessionId": info["sessionId"]})
        except AcpCallError as exc:
            raise CliError(f"cannot show session {session_id}: {exc.message}") from None
    header = f"session {info['sessionId']}"
    if info.get("title"):
        header += f": {printable(str(info['title']))}"
    click.echo(header)
    click.echo(f"cwd {printable(str(info.get('cwd', '')))}, updated {info.get('updatedAt', '')}")
    click.echo("")
    for line in render_transcript([u.get("update", {}) for u in client.updates]):
        click.echo(line)


@sessions.command("delete")
@click.argument("session_id", metavar="ID")
@_socket_query_option
@_config_option
def sessions_delete(session_id: str, socket_path: str | None, config_path: Path | None) -> None:
    """Delete session ID and its history for good (refused while it is open elsewhere)."""
    with _host_session(socket_path, config_path) as client:
        answer = initialize(client)
        capabilities = answer.get("agentCapabilities", {}).get("sessionCapabilities", {})
        if "delete" not in capabilities:
            raise CliError("the running host does not offer deleting sessions")
        try:
            client.request("session/delete", {"sessionId": session_id})
        except AcpCallError as exc:
            raise CliError(f"cannot delete session {session_id}: {exc.message}") from None
    click.echo(f"deleted session {session_id}")


# -- doctor -------------------------------------------------------------------------------------


@cli.command()
@_socket_query_option
@_config_option
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
