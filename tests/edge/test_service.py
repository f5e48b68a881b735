"""AcpService as a host sees it: the Unix socket, stdio, start/stop/restore, status, lifecycle."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio
import trio.testing
from edge_harness import Harness

from maple_acp.edge import (
    STATUS_METHOD,
    AcpService,
    AcpServiceConfig,
    ConfigError,
    ConnectionView,
    EndpointInUse,
    HostLifecycle,
    ServiceStateFile,
)
from maple_acp.listeners import UnixListener
from maple_acp.rpc import ConnectionClosed
from maple_acp.testing.client import open_acp_client
from maple_acp.testing.schema import AcpSchema


async def test_unix_socket_session(
    harness: Harness, project: Path, tmp_path: Path, acp_schema: AcpSchema
) -> None:
    path = tmp_path / "run" / "acp.sock"
    async with trio.open_nursery() as nursery:
        await harness.acp.listen(nursery, UnixListener(path))
        assert harness.acp.status().running
        stream = await trio.open_unix_socket(os.fspath(path))
        async with open_acp_client(stream) as client:
            await client.initialize()
            sid = (await client.new_session(str(project)))["sessionId"]
            assert (await client.prompt(sid, "/echo over the socket"))["stopReason"] == "end_turn"
            status = await client.call(STATUS_METHOD, {})
            assert status["connections"] == 1
            assert status["sessions"] == 1
            assert status["endpoint"] == str(path)
            client.validate(acp_schema)
        await harness.acp.stop(persist=False)
        assert not path.exists()
        assert not harness.acp.status().running


async def test_ninth_connection_refused_eight_stay_usable(
    harness: Harness, project: Path, tmp_path: Path
) -> None:
    path = tmp_path / "acp.sock"
    async with trio.open_nursery() as nursery:
        await harness.acp.listen(nursery, UnixListener(path))
        async with trio.open_nursery() as clients:
            opened = []
            for _ in range(8):
                stream = await trio.open_unix_socket(os.fspath(path))
                client = await clients.start(_client_task, stream)
                opened.append(client)
                await client.initialize()
            ninth = await trio.open_unix_socket(os.fspath(path))
            assert await ninth.receive_some(100) == b""
            await ninth.aclose()
            for client in opened:
                sid = (await client.new_session(str(project)))["sessionId"]
                assert (await client.prompt(sid, "/echo still here"))["stopReason"] == "end_turn"
            assert harness.acp.status().connections == 8
            clients.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


async def _client_task(stream: trio.SocketStream, *, task_status: trio.TaskStatus) -> None:  # type: ignore[type-arg]
    async with open_acp_client(stream) as client:
        task_status.started(client)
        await trio.sleep_forever()


async def test_second_service_on_the_same_endpoint_is_refused(
    harness: Harness, tmp_path: Path
) -> None:
    path = tmp_path / "acp.sock"
    other = AcpService(harness.runtime)
    async with trio.open_nursery() as nursery:
        await harness.acp.listen(nursery, UnixListener(path))
        with pytest.raises(EndpointInUse):
            await other.listen(nursery, UnixListener(path))
        assert harness.acp.status().running
        nursery.cancel_scope.cancel()


async def test_start_stop_persist_and_restore(harness: Harness, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    path = tmp_path / "acp.sock"
    config = AcpServiceConfig(allowed_roots=(str(tmp_path),), max_connections=3)
    acp = AcpService(harness.runtime, config, state_dir=state_dir)
    async with trio.open_nursery() as nursery:
        await acp.start(nursery, UnixListener(path))
        saved = ServiceStateFile(state_dir).load("demo-account")
        assert saved.enabled
        assert saved.max_connections == 3
        # Policy changes are refused while the listener runs.
        with pytest.raises(ConfigError):
            acp.set_config(AcpServiceConfig())
        await acp.stop()
        assert not ServiceStateFile(state_dir).load("demo-account").enabled
        # Disabled: nothing to restore.
        assert not await acp.restore_enabled(nursery, UnixListener(path))
        await acp.start(nursery, UnixListener(path))
        # A host shutdown (not the user's choice) keeps "enabled" for the next launch.
        await acp.stop(persist=False)
        fresh = AcpService(harness.runtime, AcpServiceConfig(), state_dir=state_dir)
        assert await fresh.restore_enabled(nursery, UnixListener(path))
        assert fresh.config.max_connections == 3
        assert fresh.config.allowed_roots == (str(tmp_path.resolve()),)
        assert path.exists()
        await fresh.stop(persist=False)
        # Restarting after a stop works.
        await fresh.start(nursery, UnixListener(path))
        await fresh.stop()
        nursery.cancel_scope.cancel()


async def test_restore_needs_a_signed_in_account(harness: Harness, tmp_path: Path) -> None:
    acp = AcpService(harness.runtime, state_dir=tmp_path / "state")
    async with trio.open_nursery() as nursery:
        await acp.start(nursery, UnixListener(tmp_path / "acp.sock"))
        await acp.stop(persist=False)
        harness.runtime.sign_out()
        assert not await acp.restore_enabled(nursery, UnixListener(tmp_path / "acp.sock"))


async def test_lifecycle_stops_acp_first_then_the_runtime(
    harness: Harness, project: Path, tmp_path: Path
) -> None:
    path = tmp_path / "acp.sock"
    lifecycle = HostLifecycle(harness.runtime, harness.acp)
    async with trio.open_nursery() as nursery:
        await harness.acp.listen(nursery, UnixListener(path))
        stream = await trio.open_unix_socket(os.fspath(path))
        async with open_acp_client(stream) as client:
            sid = (await client.new_session(str(project)))["sessionId"]
            await client.prompt(sid, "kept")
            report = await lifecycle.sign_out()
            assert report.ok
            assert not harness.acp.status().running
            assert not path.exists()
            # The connection was ended by the stop.
            with pytest.raises(ConnectionClosed):
                await client.list_sessions()
        assert harness.runtime.account is None
        assert harness.runtime.status().leases == 0
        nursery.cancel_scope.cancel()


async def test_lifecycle_reports_both_failures(harness: Harness) -> None:
    class BrokenAcp(AcpService):
        async def stop(self, *, persist: bool = True) -> None:
            raise RuntimeError("acp stop failed")

    lifecycle = HostLifecycle(harness.runtime, BrokenAcp(harness.runtime))

    async def broken_drain() -> bool:
        raise OSError("runtime stop failed")

    harness.runtime.drain = broken_drain  # type: ignore[method-assign]
    report = await lifecycle.shutdown()
    assert not report.ok
    assert isinstance(report.acp_error, RuntimeError)
    assert isinstance(report.runtime_error, OSError)


STDIO_HOST = textwrap.dedent(
    """
    import logging, sys, trio
    from maple_acp.edge import AcpService
    from maple_acp.testing.demo import demo_service

    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)

    async def main():
        async with demo_service(sys.argv[1]) as runtime:
            await AcpService(runtime).serve_stdio()

    trio.run(main)
    """
)


async def test_stdio_mode_carries_only_protocol_lines(
    project: Path, tmp_path: Path, acp_schema: AcpSchema
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            functools.partial(
                trio.run_process,
                [sys.executable, "-c", STDIO_HOST, str(data)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                check=False,
            )
        )
        assert process.stdin is not None
        assert process.stdout is not None
        stream = trio.StapledStream(process.stdin, process.stdout)
        async with open_acp_client(stream) as client:
            await client.initialize()
            sid = (await client.new_session(str(project)))["sessionId"]
            assert (await client.prompt(sid, "/echo over stdio"))["stopReason"] == "end_turn"
            # Every line the host wrote to stdout is a JSON-RPC frame of the schema.
            assert all(f.message is not None for f in client.frames if f.direction == "in")
            assert client.validate(acp_schema) >= 3
        with trio.fail_after(10):
            await process.wait()
        assert process.returncode == 0


async def test_connections_list_each_live_connection_with_its_sessions(
    harness: Harness, project: Path
) -> None:
    """What a host's window lists: live connections in the order accepted, each with the
    sessions it holds and its running turns."""
    acp = harness.acp
    assert acp.connections() == ()
    async with harness.connect(initialize=True) as first:
        async with harness.connect(initialize=True) as second:
            one = (await first.new_session(str(project)))["sessionId"]
            two = (await first.new_session(str(project)))["sessionId"]
            three = (await second.new_session(str(project)))["sessionId"]
            assert acp.connections() == (
                ConnectionView(number=1, session_ids=(one, two), active_runs=0),
                ConnectionView(number=2, session_ids=(three,), active_runs=0),
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(first.prompt, two, "/echo started\n/hang")
                await first.wait_until(lambda: first.text(two) == "started")
                assert acp.connections()[0].active_runs == 1
                await first.cancel(two)
            await first.close_session(one)
            assert acp.connections()[0] == ConnectionView(
                number=1, session_ids=(two,), active_runs=0
            )
        assert acp.connections() == (ConnectionView(number=1, session_ids=(two,), active_runs=0),)
    assert acp.connections() == ()
    async with harness.connect(initialize=True):
        assert [view.number for view in acp.connections()] == [3]
