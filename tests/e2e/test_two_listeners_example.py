"""``examples/two_listeners_host.py``: one embedded host serves a prompt through the connector
on its Unix socket and a network client at its URL at once, in one connection count, and its
stop ends both listeners."""

from __future__ import annotations

import os
from pathlib import Path

import httpx2
import orjson
import trio

from maple_acp.testing.schema import AcpSchema

from .host_processes import (
    DEADLINE,
    clean_env,
    connector_client,
    example_command,
    run_command,
    serving_process,
)

EXAMPLE = "two_listeners_host.py"
READY = "example host: serving on "
INITIALIZE = orjson.dumps(
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": 1, "clientCapabilities": {}},
    }
)


def _command(short_dir: Path, listen: str = "127.0.0.1:0") -> tuple[list[str], Path]:
    socket_path = short_dir / "run" / "acp.sock"
    command = example_command(EXAMPLE, socket_path, short_dir / "data")
    return [*command, "--http", listen], socket_path


async def test_one_host_serves_the_socket_and_the_network_side_by_side(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    command, socket_path = _command(short_dir)
    with trio.fail_after(DEADLINE):
        async with (
            serving_process(
                command, env=clean_env(), ready=lambda line: line.startswith(READY)
            ) as (host, stderr),
            connector_client(socket_path) as connector,
            httpx2.AsyncClient(trust_env=False, timeout=DEADLINE) as http,
        ):
            ready = await stderr.wait_for(lambda line: line.startswith(READY))
            socket_shown, _, rest = ready.removeprefix(READY).partition(" and ")
            url, _, token_file = rest.partition(" (token in ")
            assert socket_shown == os.fspath(socket_path)
            token = Path(token_file.removesuffix(")")).read_text().strip()
            assert Path(token_file.removesuffix(")")) == short_dir / "data" / "http-token"

            client = connector.client
            await client.initialize()
            session_id = (await client.new_session(os.fspath(project)))["sessionId"]
            answer = await client.prompt(session_id, "hello over the socket")
            assert answer["stopReason"] == "end_turn"
            assert client.text(session_id) == "hello over the socket"
            client.validate(acp_schema)

            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            opened = await http.post(url, content=INITIALIZE, headers=headers)
            assert opened.status_code == 200, opened.text
            assert opened.json()["result"]["protocolVersion"] == 1
            status = await client.call("_maple/status", {})
            assert status["connections"] == 2
            assert status["endpoint"] == os.fspath(socket_path)
            unauthorized = await http.post(
                url, content=INITIALIZE, headers={**headers, "Authorization": "Bearer nope"}
            )
            assert unauthorized.status_code == 401
    assert host.returncode == 0, stderr.text
    assert stderr.lines[-1] == "example host: stopped"
    assert not socket_path.exists()
    assert not any("Traceback" in line for line in stderr.lines)


def test_an_address_other_than_loopback_without_tls_is_refused_in_one_line(
    short_dir: Path,
) -> None:
    command, socket_path = _command(short_dir, "192.0.2.1:8765")
    done = run_command(command)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "example host: refusing to serve HTTP on 192.0.2.1, which is not a loopback address, "
        "without TLS: set tls_cert and tls_key (or bind 127.0.0.1 behind a proxy)"
    ]
    assert not socket_path.exists()
