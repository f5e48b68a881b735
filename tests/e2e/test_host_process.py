"""The host process's life: disconnects leave nothing behind, stop, refusal, limits, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from maple_acp.cli import CliError
from maple_acp.rpc import ConnectionClosed
from maple_acp.testing.schema import AcpSchema

from .host_processes import (
    CONNECTOR,
    DEADLINE,
    MAPLE_ACP,
    clean_env,
    connector_client,
    run_command,
    running_host,
    start_host_process,
)


def _idle(status: Mapping[str, Any]) -> bool:
    # The status query itself is one connection.
    return status["leases"] == 0 and status["activeRuns"] == 0 and status["connections"] == 1


async def test_disconnect_mid_prompt_leaves_no_lease_or_run(short_dir: Path, project: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with connector_client(host.socket) as connector:
                client = connector.client
                await client.initialize()
                session_id = (await client.new_session(os.fspath(project)))["sessionId"]

                async def prompt() -> None:
                    with pytest.raises(ConnectionClosed):
                        await client.prompt(session_id, "/echo started\n/hang")

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(prompt)
                    await client.wait_until(lambda: client.text(session_id) == "started")
                    busy = await host.status()
                    assert busy["activeRuns"] == 1
                    assert busy["leases"] == 1
                    connector.process.kill()
            assert connector.process.returncode == -signal.SIGKILL
            await host.wait_status(_idle)


async def test_disconnect_mid_permission_leaves_no_lease_or_run(
    short_dir: Path, project: Path
) -> None:
    asked = trio.Event()

    async def never_answer(params: Mapping[str, Any]) -> Any:
        asked.set()
        await trio.sleep_forever()

    marker = project / "must-not-exist"
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with connector_client(host.socket, permission=never_answer) as connector:
                client = connector.client
                await client.initialize()
                session_id = (await client.new_session(os.fspath(project)))["sessionId"]

                async def prompt() -> None:
                    with pytest.raises(ConnectionClosed):
                        await client.prompt(
                            session_id, f'/tool shell {{"command": "touch {marker}"}}'
                        )

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(prompt)
                    await asked.wait()
                    assert (await host.status())["activeRuns"] == 1
                    connector.process.kill()
                    # The permission wait never answered by the client must not block the exit.
                    nursery.cancel_scope.deadline = trio.current_time() + DEADLINE
            await host.wait_status(_idle)
            assert not marker.exists()


async def test_host_stopped_under_a_connected_client(short_dir: Path, project: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with connector_client(host.socket) as connector:
                client = connector.client
                await client.initialize()
                await client.new_session(os.fspath(project))
                host.send_signal(signal.SIGTERM)
                assert await host.process.wait() == 0
                # The connector notices the host is gone while its stdin is still open.
                assert await connector.process.wait() == 3
                await connector.stderr.wait_closed()
            assert len(connector.stderr.lines) == 1
            assert "closed the connection" in connector.stderr.lines[0]
            assert not host.socket.exists()
            assert "maple-acp: stopped" in host.stderr.lines
            assert not any("Traceback" in line for line in host.stderr.lines)


async def test_second_host_on_the_same_endpoint_is_refused(short_dir: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            (short_dir / "other").mkdir()
            async with trio.open_nursery() as nursery:
                second = await start_host_process(
                    nursery, short_dir, "--data-dir", os.fspath(short_dir / "other" / "data")
                )
                assert await second.process.wait() == 1
                await second.stderr.wait_closed()
            assert second.stderr.lines == [
                f"maple-acp: another service is already listening at {host.socket}"
            ]
            # The first one is untouched and still serves.
            assert host.socket.exists()
            assert (await host.status())["running"] is True


async def test_ninth_connection_is_refused_while_eight_stay_usable(
    short_dir: Path, acp_schema: AcpSchema
) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with trio.open_nursery() as nursery:
                connectors: list[Any] = []
                release = trio.Event()
                ready = trio.Semaphore(0)

                async def hold() -> None:
                    async with connector_client(host.socket) as connector:
                        await connector.client.initialize()
                        connectors.append(connector)
                        ready.release()
                        await release.wait()
                        # Still usable after the ninth was turned away.
                        listing = await connector.client.list_sessions()
                        assert listing == {"sessions": []}
                        connector.client.validate(acp_schema)

                for _ in range(8):
                    nursery.start_soon(hold)
                for _ in range(8):
                    await ready.acquire()

                async with connector_client(host.socket) as ninth:
                    # The host closes it at accept; the connector reports it and exits.
                    assert await ninth.process.wait() == 3
                    await ninth.stderr.wait_closed()
                    assert "closed the connection" in ninth.stderr.text
                    assert not [f for f in ninth.client.frames if f.direction == "in"]
                # A status query needs a slot too: it is turned away, and says why.
                with pytest.raises(CliError, match="all connections in use"):
                    await host.status()
                release.set()
            await host.wait_status(_idle)
            assert any("refusing an ACP connection" in line for line in host.stderr.lines)


async def test_sigint_removes_the_socket_and_exits_cleanly(short_dir: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            assert host.socket.is_socket()
            assert (host.socket.stat().st_mode & 0o777) == 0o600
            host.send_signal(signal.SIGINT)
            assert await host.process.wait() == 0
            await host.stderr.wait_closed()
        assert not host.socket.exists()
        assert not any("Traceback" in line for line in host.stderr.lines)
        assert (short_dir / "data").stat().st_mode & 0o777 == 0o700


async def test_serve_writes_nothing_on_stdout(short_dir: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            host.send_signal(signal.SIGTERM)
            assert host.process.stdout is not None
            assert await host.process.stdout.receive_some() == b""


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return run_command(args, env=clean_env(**env))


def test_version_with_no_host_running(short_dir: Path) -> None:
    absent = os.fspath(short_dir / "absent.sock")
    for command in (
        [*MAPLE_ACP, "--version"],
        [*MAPLE_ACP, "-V"],
        [*MAPLE_ACP, "acp", "--version"],
        [*CONNECTOR, "--version"],
    ):
        done = _run(command, MAPLE_ACP_SOCKET=absent)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("maple-acp ")
        assert done.stdout.count("\n") == 1
        assert done.stderr == ""
    assert not os.path.exists(absent)


def test_status_with_no_host_running(short_dir: Path) -> None:
    absent = short_dir / "absent.sock"
    done = _run([*MAPLE_ACP, "status", "--socket", os.fspath(absent)])
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "unavailable" in done.stderr
    assert os.fspath(absent) in done.stderr


def test_connector_with_no_host_running(short_dir: Path) -> None:
    absent = short_dir / "absent.sock"
    done = run_command([*MAPLE_ACP, "acp", "--socket", os.fspath(absent)], input="")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "unavailable" in done.stderr


async def test_status_reports_a_running_host(short_dir: Path, project: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host, connector_client(host.socket) as connector:
            await connector.client.initialize()
            await connector.client.new_session(os.fspath(project))
            done = await trio.to_thread.run_sync(
                _run, [*MAPLE_ACP, "status", "--socket", os.fspath(host.socket), "--json"]
            )
            assert done.returncode == 0, done.stderr
            status = json.loads(done.stdout)
            assert status == {
                "running": True,
                "endpoint": os.fspath(host.socket),
                "connections": 2,
                "sessions": 1,
                "activeRuns": 0,
                "leases": 1,
                "signedIn": True,
                "engine": {"backend": "demo", "defaultModel": "demo-echo"},
            }
            done = await trio.to_thread.run_sync(
                partial(_run, [*MAPLE_ACP, "status"], MAPLE_ACP_SOCKET=os.fspath(host.socket))
            )
            assert done.returncode == 0, done.stderr
            assert "sessions:     1" in done.stdout
            assert "backend:      demo" in done.stdout


async def test_a_request_piped_before_end_of_input_is_answered(short_dir: Path) -> None:
    request = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            # `printf REQUEST | maple-acp acp`: stdin ends right after the request.
            done = await trio.run_process(
                [*MAPLE_ACP, "acp", "--socket", os.fspath(host.socket)],
                stdin=request,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=clean_env(),
            )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["id"] == 1
    assert answer["result"]["protocolVersion"] == 1
