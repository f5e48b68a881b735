"""``maple-acp sessions``: list, show and delete the running host's sessions, as an ACP
client of it (over the socket, with the standard library only).

Output: the report on stdout; a failure is one line on stderr and exit status 1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import click

from maple_acp.cli._client import (
    AcpCallError,
    HostUnavailable,
    LineClient,
    connect_host,
    initialize,
    list_sessions,
    printable,
    render_transcript,
)
from maple_acp.cli._errors import CliError
from maple_acp.cli._options import (
    CONTEXT_SETTINGS,
    config_option,
    host_endpoint,
    socket_query_option,
)

#: ``sessions`` gives up on a host that sends nothing for this long (a replay streams steadily).
SESSIONS_IDLE_TIMEOUT_S: Final = 30.0


@contextmanager
def _host_session(socket_path: str | None, config_path: Path | None) -> Iterator[LineClient]:
    """An initialized client of the running host; any failure becomes one :class:`CliError`."""
    endpoint = host_endpoint(socket_path, config_path)
    try:
        with connect_host(endpoint, idle_timeout=SESSIONS_IDLE_TIMEOUT_S) as client:
            yield client
    except (HostUnavailable, AcpCallError) as exc:
        raise CliError(str(exc)) from None


@click.group(context_settings=CONTEXT_SETTINGS)
def sessions() -> None:
    """List, show and delete the running host's sessions (as an ACP client of it)."""


@sessions.command("list")
@click.option("--cwd", metavar="DIR", help="Only sessions whose working directory is DIR.")
@click.option("--json", "as_json", is_flag=True, help='Print {"sessions": [...]} as JSON.')
@socket_query_option
@config_option
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
@socket_query_option
@config_option
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
@socket_query_option
@config_option
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
