"""The ``maple-acp`` command line (click). ``acp`` and ``--version`` never reach this module.

``serve`` runs the runtime and the ACP service on the embedded defaults (SQLite under the
user data directory, the demo backend, the local OS account) until SIGINT or SIGTERM.
``status`` asks a running service for its counters over the socket with the standard library
only. ``demo`` runs a service in this process and drives a short session through a real
connector subprocess, printing the conversation.

Output rules: ``serve`` writes nothing to stdout (its one ready line and its logs go to
stderr); ``status`` and ``demo`` print their report on stdout; every failure is one line on
stderr and exit status 1.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import re
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Final

import attrs
import click

from maple_acp_connector._version import __version__
from maple_acp_connector.endpoint import (
    ENDPOINT_ENV,
    check_endpoint_socket,
    ensure_private_dir,
    resolve_endpoint,
)
from maple_acp_connector.endpoint import (
    EndpointError as ConnectorEndpointError,
)

logger = logging.getLogger(__name__)

#: The directory under ``$XDG_DATA_HOME`` (or ``~/.local/share``) that holds the task store.
DATA_DIR_NAME: Final = "maple-acp"
#: The store file inside the data directory.
STORE_FILE_NAME: Final = "tasks.sqlite3"
#: ``status`` gives up on a service that does not answer within this (it is a local socket).
STATUS_TIMEOUT_S: Final = 5.0
#: A status answer is a few hundred bytes; anything longer is not one.
MAX_STATUS_BYTES: Final = 64 * 1024
#: The demo gives its whole scripted session this long before calling it stuck.
DEMO_DEADLINE_S: Final = 60.0
#: The line ``serve`` writes on stderr once clients can connect (tests and scripts wait for it).
READY_PREFIX: Final = "maple-acp: serving on "

_LOG_LEVELS: Final = ("debug", "info", "warning", "error")
#: SPEC limit on simultaneous ACP connections (the edge enforces it again).
MAX_CONNECTIONS: Final = 8
#: A hello carries at most this many values, so a longer allow-list is a mistake.
MAX_RELAY_NAMES: Final = 16
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CliError(click.ClickException):
    """A failure reported as one ``maple-acp: ...`` line on stderr with exit status 1."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"maple-acp: {self.format_message()}", err=True)


def default_data_dir(env: Mapping[str, str]) -> Path:
    """``$XDG_DATA_HOME/maple-acp`` when that is an absolute path, else
    ``~/.local/share/maple-acp``."""
    base = env.get("XDG_DATA_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / DATA_DIR_NAME


def prepare_data_dir(path: Path) -> Path:
    """Create ``path`` 0700 (parents as ordinary directories) or check the existing one is
    private to this user; the store file inside holds conversations."""
    path = Path(os.path.abspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    ensure_private_dir(path)
    return path


def local_account() -> str:
    """The account the CLI host signs in: the OS user name (the uid if it has none)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = ""
    return name or f"uid-{os.getuid()}"


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="maple-acp %(levelname)s %(name)s: %(message)s",
    )


@attrs.frozen(kw_only=True)
class HostOptions:
    """Everything ``serve`` (and an embedding test) needs to run the default host."""

    endpoint: Path
    data_dir: Path
    allowed_roots: tuple[str, ...] = ()
    max_connections: int = MAX_CONNECTIONS
    provisional_grace_s: float | None = None
    relay_allow: frozenset[str] = frozenset()
    account: str = attrs.field(factory=local_account)


@asynccontextmanager
async def open_default_host(options: HostOptions) -> AsyncIterator[Any]:
    """Run the store, the demo runtime (signed in) and the ACP service listening on
    ``options.endpoint``; yield the :class:`~maple_acp.edge.HostLifecycle`.

    Resource handling: on exit the ACP service is stopped before the runtime is drained
    (``HostLifecycle.shutdown``), then the store is closed; the socket file is removed.

    Error handling: :class:`~maple_acp.edge.EndpointError` (the endpoint is refused or
    another service answers on it) and ``maple_acp.edge.ConfigError`` propagate before
    anything listens.
    """
    import trio

    from maple_acp.backends.demo import DemoBackend, demo_catalog, demo_policy
    from maple_acp.edge import AcpService, AcpServiceConfig, HostLifecycle
    from maple_acp.runtime import DEFAULT_PROVISIONAL_GRACE_S, AgentService
    from maple_acp.store import SqliteTaskStore

    config = AcpServiceConfig(
        allowed_roots=options.allowed_roots, max_connections=options.max_connections
    )
    grace = options.provisional_grace_s
    store = await SqliteTaskStore.open(options.data_dir / STORE_FILE_NAME)
    async with store:
        runtime = AgentService(
            store=store,
            backend=DemoBackend(),
            catalog=demo_catalog(),
            policy=demo_policy(),
            installation_id=DATA_DIR_NAME,
            provisional_grace_s=DEFAULT_PROVISIONAL_GRACE_S if grace is None else grace,
            relay_allow_list=options.relay_allow,
            # The allowed roots are the ACP service's policy (``config`` above), enforced once
            # at the edge.
        )
        async with runtime:
            runtime.sign_in(options.account)
            acp = AcpService(runtime, config)
            lifecycle = HostLifecycle(runtime, acp)
            async with trio.open_nursery() as nursery:
                await acp.start(nursery, options.endpoint)
                try:
                    yield lifecycle
                finally:
                    with trio.CancelScope(shield=True):
                        report = await lifecycle.shutdown()
                    if not report.ok:
                        logger.error("the host did not shut down cleanly: %s", report)
                    nursery.cancel_scope.cancel()


def _unwrap(exc: BaseException) -> BaseException:
    """The single exception inside nested one-member exception groups (Trio nurseries wrap)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def _serve(options: HostOptions) -> None:
    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_default_host(options):
            click.echo(f"{READY_PREFIX}{options.endpoint}", err=True)
            async for signum in signals:
                logger.info("%s received; shutting down", signal.Signals(signum).name)
                break


def _endpoint_for(cli_socket: str | None) -> Path:
    """The endpoint, with the default's private directory created (0700) or verified."""
    endpoint = resolve_endpoint(cli_socket, os.environ)
    if not cli_socket and not os.environ.get(ENDPOINT_ENV):
        try:
            ensure_private_dir(endpoint.parent)
        except ConnectorEndpointError as exc:
            raise CliError(str(exc)) from None
    return endpoint


def _check_relay_names(
    ctx: click.Context, param: click.Parameter, names: Sequence[str]
) -> Sequence[str]:
    for name in names:
        if not _ENV_NAME.fullmatch(name):
            raise click.BadParameter(f"{name!r} is not an environment variable name")
    if len(set(names)) > MAX_RELAY_NAMES:
        raise click.BadParameter(f"at most {MAX_RELAY_NAMES} names")
    return names


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


@click.group()
@click.version_option(__version__, "--version", "-V", message="maple-acp %(version)s")
def cli() -> None:
    """Expose this host's agent runtime to ACP clients.

    ACP clients run `maple-acp acp` (the stdio connector); `serve` must be running.
    """


@cli.command()
@click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    help=f"Listen on PATH instead of this installation's endpoint (also: ${ENDPOINT_ENV}).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory of the task store (default: $XDG_DATA_HOME/maple-acp).",
)
@click.option(
    "--allowed-root",
    "allowed_roots",
    multiple=True,
    metavar="DIR",
    help="Admit sessions only under DIR (repeatable; default: any absolute directory).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1, MAX_CONNECTIONS),
    default=MAX_CONNECTIONS,
    show_default=True,
    help="Simultaneous ACP connections.",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="How long a never-prompted session survives a disconnect (default 600; 0 deletes).",
)
@click.option(
    "--relay-allow",
    multiple=True,
    metavar="NAME",
    callback=_check_relay_names,
    help="An environment variable name the connector may relay to shell tools (repeatable).",
)
@click.option("--log-level", type=click.Choice(_LOG_LEVELS), default="info", show_default=True)
def serve(
    socket_path: str | None,
    data_dir: Path | None,
    allowed_roots: Sequence[str],
    max_connections: int,
    grace: float | None,
    relay_allow: Sequence[str],
    log_level: str,
) -> None:
    """Run the agent runtime and the ACP service until SIGINT or SIGTERM."""
    _configure_logging(log_level)
    for root in allowed_roots:
        if not os.path.isabs(root) or not os.path.isdir(root):
            raise CliError(f"--allowed-root must be an existing absolute directory: {root!r}")
    endpoint = _endpoint_for(socket_path)
    _refuse_live_endpoint(endpoint)
    try:
        directory = prepare_data_dir(data_dir or default_data_dir(os.environ))
    except (ConnectorEndpointError, OSError) as exc:
        raise CliError(f"cannot use the data directory: {exc}") from None
    from maple_acp.edge import ConfigError, EndpointError

    try:
        options = HostOptions(
            endpoint=endpoint,
            data_dir=directory,
            allowed_roots=tuple(allowed_roots),
            max_connections=max_connections,
            provisional_grace_s=grace,
            relay_allow=frozenset(relay_allow),
        )
        import trio

        trio.run(_serve, options)
    except BaseException as exc:
        inner = _unwrap(exc)
        if isinstance(inner, EndpointError | ConfigError):
            raise CliError(str(inner)) from None
        raise
    click.echo("maple-acp: stopped", err=True)


# -- status ----------------------------------------------------------------------------------


def query_status(endpoint: Path, *, timeout: float = STATUS_TIMEOUT_S) -> dict[str, Any]:
    """Ask the service at ``endpoint`` for ``_maple/status``; raise :class:`CliError` with
    one line when there is none or it does not answer."""
    try:
        check_endpoint_socket(endpoint)
    except ConnectorEndpointError as exc:
        raise CliError(str(exc)) from None
    request = {"jsonrpc": "2.0", "id": 1, "method": "_maple/status", "params": {}}
    buffer = bytearray()
    turned_away = CliError(
        f"the service at {endpoint} closed the connection without answering "
        "(all connections in use?)"
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(os.fspath(endpoint))
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise CliError(
                f"the maple-acp service is unavailable at {endpoint}: {reason}"
            ) from None
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
            while b"\n" not in buffer:
                chunk = sock.recv(4096)
                if not chunk:
                    raise turned_away
                buffer += chunk
                if len(buffer) > MAX_STATUS_BYTES:
                    raise CliError(f"the service at {endpoint} sent an oversized answer")
        except TimeoutError:
            raise CliError(f"the service at {endpoint} did not answer in time") from None
        except (ConnectionResetError, BrokenPipeError):
            # A host closes a connection over its limit at accept, unread request and all.
            raise turned_away from None
        except OSError as exc:
            raise CliError(
                f"lost the connection to the service at {endpoint}: {exc.strerror or exc}"
            ) from None
    try:
        answer = json.loads(bytes(buffer).split(b"\n", 1)[0])
    except ValueError:
        raise CliError(f"the service at {endpoint} sent something that is not JSON") from None
    result = answer.get("result") if isinstance(answer, dict) else None
    if not isinstance(result, dict):
        raise CliError(f"the service at {endpoint} did not return a status")
    return result


def format_status(status: Mapping[str, Any]) -> str:
    connections = status.get("connections", 0)
    lines = [
        f"maple-acp service running at {status.get('endpoint')}",
        f"  signed in:    {'yes' if status.get('signedIn') else 'no'}",
        f"  connections:  {connections} (this query included)",
        f"  sessions:     {status.get('sessions', 0)}",
        f"  active runs:  {status.get('activeRuns', 0)}",
        f"  leases:       {status.get('leases', 0)}",
    ]
    return "\n".join(lines)


@cli.command()
@click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    help=f"Ask the service at PATH instead of this installation's (also: ${ENDPOINT_ENV}).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the raw status object.")
def status(socket_path: str | None, as_json: bool) -> None:
    """Tell whether a service answers on this installation's endpoint, and its counters."""
    endpoint = resolve_endpoint(socket_path, os.environ)
    result = query_status(endpoint)
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
    else:
        click.echo(format_status(result))


# -- demo ------------------------------------------------------------------------------------


def _short(text: str, limit: int = 72) -> str:
    text = " ".join(text.split()) if "\n" in text else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Transcript:
    """Writes the demo's conversation as it happens: ``->`` client to agent, ``<-`` back."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write
        self._seen = 0

    def say(self, line: str) -> None:
        self._write(line)

    def updates(self, client: Any, label: str = "") -> None:
        """Print every ``session/update`` that arrived since the last call."""
        updates = client.updates()
        for update in updates[self._seen :]:
            self._write(f"   <- {label}{describe_update(update)}")
        self._seen = len(updates)

    def restart(self) -> None:
        self._seen = 0


def describe_update(update: Mapping[str, Any]) -> str:
    kind = str(update.get("sessionUpdate"))
    if kind in ("agent_message_chunk", "user_message_chunk", "agent_thought_chunk"):
        content = update.get("content", {})
        text = content.get("text", "") if isinstance(content, dict) else ""
        name = {"agent_message_chunk": "agent", "user_message_chunk": "user"}.get(kind, "thought")
        return f"{name}: {_short(text)!s}"
    if kind in ("tool_call", "tool_call_update"):
        parts = [kind, str(update.get("status", ""))]
        if update.get("title"):
            parts.append(repr(update["title"]))
        for item in update.get("content") or []:
            inner = item.get("content", {}) if isinstance(item, dict) else {}
            if isinstance(inner, dict) and inner.get("text"):
                parts.append(f"output {_short(inner['text'], 40)!r}")
        return " ".join(part for part in parts if part)
    if kind == "config_option_update":
        return "config_option_update (the model is now locked for this session)"
    if kind == "session_info_update":
        return f"session info: title {update.get('title')!r}"
    return kind


DEMO_STREAM_PROMPT: Final = (
    "/think The demo backend reads this prompt as a script.\n"
    "Hello from the maple-acp demo backend.\n"
    "/stream 4 6\n"
    "/usage 12 34"
)
DEMO_TOOL_PROMPT: Final = '/tool shell {"command": "echo hi"}'
DEMO_HANG_PROMPT: Final = "/echo working on it…\n/hang"


async def run_demo(
    endpoint: Path, project: Path, transcript: Transcript, *, connector: Sequence[str]
) -> None:
    """Drive one scripted session through a real connector subprocess and narrate it."""
    import subprocess

    import trio

    from maple_acp.testing.client import open_acp_client

    @asynccontextmanager
    async def connect(name: str, permission: Any) -> AsyncIterator[Any]:
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    [*connector, "--socket", os.fspath(endpoint)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    check=False,
                )
            )
            transcript.say(f"== {name}: connector pid {process.pid} ({' '.join(connector[1:])})")
            assert process.stdin is not None
            assert process.stdout is not None
            stream = trio.StapledStream(process.stdin, process.stdout)
            async with open_acp_client(stream, permission=permission) as client:
                yield client
            await process.wait()
            transcript.say(f"== {name}: connector exited with status {process.returncode}")

    def permission(params: Mapping[str, Any]) -> str:
        options = ", ".join(str(o.get("optionId")) for o in params.get("options", []))
        title = params.get("toolCall", {}).get("title")
        transcript.say(f"   <- session/request_permission {title!r} options [{options}]")
        transcript.say("   -> answer allow_once")
        return "allow"

    async with connect("connection 1", permission) as client:
        transcript.say("-> initialize (protocolVersion 1)")
        init = await client.initialize()
        info = init.get("agentInfo", {})
        caps = init.get("agentCapabilities", {})
        transcript.say(
            f"   <- {info.get('name')} {info.get('version')}, "
            f"protocol {init.get('protocolVersion')}, loadSession={caps.get('loadSession')}"
        )
        transcript.say(f"-> session/new cwd={project}")
        new = await client.new_session(os.fspath(project))
        session_id = new["sessionId"]
        models = [o for o in new.get("configOptions", []) if o.get("id") == "model"]
        model = models[0].get("currentValue") if models else None
        transcript.say(f"   <- sessionId {session_id}, model {model}")

        for prompt in (DEMO_STREAM_PROMPT, DEMO_TOOL_PROMPT):
            transcript.say(f"-> session/prompt {_short(prompt)!r}")
            answer = await client.prompt(session_id, prompt)
            transcript.updates(client)
            usage = answer.get("usage")
            suffix = (
                f", usage {usage.get('inputTokens')}/{usage.get('outputTokens')}" if usage else ""
            )
            transcript.say(f"   <- stopReason {answer['stopReason']}{suffix}")

        transcript.say(f"-> session/prompt {_short(DEMO_HANG_PROMPT)!r}")
        result: dict[str, Any] = {}

        async def hang() -> None:
            result.update(await client.prompt(session_id, DEMO_HANG_PROMPT))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hang)
            before = len(client.updates(session_id))
            await client.wait_until(lambda: len(client.updates(session_id)) > before)
            transcript.updates(client)
            transcript.say("-> session/cancel")
            await client.cancel(session_id)
        transcript.updates(client)
        transcript.say(f"   <- stopReason {result.get('stopReason')}")

        transcript.say("-> session/close")
        await client.close_session(session_id)
        transcript.say("   <- closed (the task stays in history)")

    transcript.restart()
    async with connect("connection 2", permission) as client:
        transcript.say("-> initialize")
        await client.initialize()
        transcript.say(f"-> session/list cwd={project}")
        listing = await client.list_sessions(cwd=os.fspath(project))
        for item in listing.get("sessions", []):
            title = f" {item['title']!r}" if item.get("title") else ""
            transcript.say(f"   <- {item.get('sessionId')}{title} updated {item.get('updatedAt')}")
        transcript.say(f"-> session/load {session_id} (history is replayed before the answer)")
        await client.load_session(session_id, os.fspath(project))
        transcript.updates(client, "replay ")
        transcript.say("   <- loaded")
        transcript.say("-> session/close")
        await client.close_session(session_id)
        transcript.say("   <- closed")


async def _demo_main(connector: Sequence[str], write: Callable[[str], None]) -> None:
    import trio

    with tempfile.TemporaryDirectory(prefix="maple-acp-demo-") as scratch:
        root = Path(scratch)
        (root / "project").mkdir()
        options = HostOptions(
            endpoint=root / "run" / "acp.sock",
            data_dir=prepare_data_dir(root / "data"),
            account="demo",
        )
        transcript = Transcript(write)
        with trio.fail_after(DEMO_DEADLINE_S):
            async with open_default_host(options):
                transcript.say(f"maple-acp demo: service listening on {options.endpoint}")
                await run_demo(options.endpoint, root / "project", transcript, connector=connector)
        transcript.say("maple-acp demo: service stopped; done")


@cli.command()
@click.option("--log-level", type=click.Choice(_LOG_LEVELS), default="warning", show_default=True)
def demo(log_level: str) -> None:
    """Run a service in this process and a scripted session through a real connector."""
    _configure_logging(log_level)
    import trio

    connector = [sys.executable, "-m", "maple_acp_connector"]
    try:
        trio.run(_demo_main, connector, click.echo)
    except BaseException as exc:
        inner = _unwrap(exc)
        if isinstance(inner, KeyboardInterrupt):
            raise
        if isinstance(inner, trio.TooSlowError):
            raise CliError(f"the demo did not finish within {DEMO_DEADLINE_S:.0f} s") from None
        raise
