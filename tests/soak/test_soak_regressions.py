"""What the soak run found, each pinned to the exact window with real processes.

Every test starts a real ``maple-acp serve`` and a real connector, as the soak does, and checks
the host's own stderr and ``maple-acp status --json``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from soak_bench import load_soak

soak = load_soak()

#: Bounds a hang; every step here takes well under a second.
DEADLINE = 60.0
#: Rounds of a scenario whose window is a race.
ROUNDS = 8


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private scratch directory with a short path: a socket path must fit in sun_path."""
    path = Path(tempfile.mkdtemp(prefix="soakreg-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@asynccontextmanager
async def running_host(directory: Path) -> AsyncIterator[Any]:
    host_command, _ = soak._commands()
    (directory / "run").mkdir(mode=0o700)
    host = soak.Host(
        host_command, directory / "run" / "acp.sock", directory / "data", soak._environment({})
    )
    async with trio.open_nursery() as nursery:
        await host.start(nursery)
        try:
            yield host
        finally:
            if host.process.returncode is None:
                await host.stop()


async def _send(stream: trio.abc.SendStream, message: dict[str, Any]) -> None:
    await stream.send_all(json.dumps(message).encode() + b"\n")


async def _read_until(stream: trio.abc.ReceiveStream, predicate: Any) -> dict[str, Any]:
    buffer = b""
    while True:
        data = await stream.receive_some(65536)
        assert data, "the connector closed its output"
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            message = json.loads(line)
            if predicate(message):
                return message


async def _wait_idle(host: Any) -> dict[str, Any]:
    while True:
        assert host.process.returncode is None, f"the host died: {list(host.stderr.lines)}"
        status = await host.status()
        if status is not None and status["leases"] == 0 and status["connections"] == 1:
            return status
        await trio.sleep(0.05)


async def test_client_gone_under_a_stream_logs_no_error(short_dir: Path) -> None:
    """Soak finding: a client that vanished while its prompt's updates were being written
    made the host log ``ERROR request handler for 'session/prompt' failed`` with a traceback
    (``ConnectionClosed`` escaping the turn's nursery); a disconnect is not an error."""
    project = short_dir / "project"
    project.mkdir()
    _, connectors = soak._commands()
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            async with soak.connector(connectors[0], host.socket, host.env) as process:
                stdin, stdout = process.stdin, process.stdout
                await _send(
                    stdin,
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "initialize",
                        "params": {"protocolVersion": 1},
                    },
                )
                await _send(
                    stdin,
                    {
                        "jsonrpc": "2.0",
                        "id": 2,
                        "method": "session/new",
                        "params": {"cwd": os.fspath(project), "mcpServers": []},
                    },
                )
                answer = await _read_until(stdout, lambda m: m.get("id") == 2)
                session_id = answer["result"]["sessionId"]
                text = "/stream 20000 4096"
                prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
                await _send(
                    stdin, {"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": prompt}
                )
                # The stream is under way (80 MB: it cannot be over); the client vanishes.
                await _read_until(stdout, lambda m: m.get("method") == "session/update")
                process.kill()
            await _wait_idle(host)
            assert await host.stop() == 0
    assert host.stderr.defects == [], list(host.stderr.lines)


async def _open_raw_session(process: Any, project: Path) -> tuple[str, Any, Any]:
    stdin, stdout = process.stdin, process.stdout
    initialize = {"protocolVersion": 1}
    await _send(stdin, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize})
    new = {"cwd": os.fspath(project), "mcpServers": []}
    await _send(stdin, {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": new})
    answer = await _read_until(stdout, lambda m: m.get("id") == 2)
    return answer["result"]["sessionId"], stdin, stdout


async def _wait_blocked_writing(pid: int) -> None:
    """Until the connector's output pipe is full: its thread that copies the host's bytes to
    stdout sleeps in the kernel's pipe write (the client stopped reading)."""
    while True:
        for task in os.listdir(f"/proc/{pid}/task"):
            wchan = Path(f"/proc/{pid}/task/{task}/wchan").read_text()
            if "pipe_write" in wchan or "pipe_wait" in wchan:
                return
        await trio.sleep(0.05)


async def test_client_gone_while_goal_cycles_wait_for_credit_keeps_the_host(
    short_dir: Path,
) -> None:
    """Soak finding: ``ConnectionClosed`` raised while a goal snapshot waited for outbound
    credit escaped the goal pump's nursery as an exception group and ended the whole host."""
    project = short_dir / "project"
    project.mkdir()
    _, connectors = soak._commands()
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host:
            # The window is a race between the writer's failure and the revocation that
            # follows it; a few rounds make missing it unlikely (about half of them hit it).
            for _ in range(ROUNDS):
                async with soak.connector(connectors[0], host.socket, host.env) as process:
                    session_id, stdin, stdout = await _open_raw_session(process, project)
                    goal = {
                        "sessionId": session_id,
                        "action": "set",
                        "objective": "complete after 9999",
                    }
                    await _send(
                        stdin,
                        {"jsonrpc": "2.0", "id": 3, "method": "_session/goal", "params": goal},
                    )
                    await _read_until(stdout, lambda m: m.get("id") == 3)
                    # The client reads no more: cycles go on until the host's outbound credit
                    # for this connection is spent and the goal pump waits for it. Then the
                    # client dies.
                    await _wait_blocked_writing(process.pid)
                    process.kill()
                await _wait_idle(host)
            assert await host.stop() == 0
    assert host.stderr.defects == [], list(host.stderr.lines)


async def test_a_sender_cancelled_as_the_connection_ends_leaves_quietly() -> None:
    """Soak finding (MCP mix): a prompt's sender waiting for outbound credit was cancelled, and
    before it ran again the connection ended and emptied the credit queue; the sender then
    tried to remove itself from that queue and raised ``ValueError`` (logged as a failed
    request handler). Sans-I/O enough to hit the exact window: a peer whose single credit is
    held by a line nobody reads."""
    from maple_acp.rpc import JsonRpcPeer

    ours, theirs = trio.testing.lockstep_stream_pair()
    peer = JsonRpcPeer(ours, max_outbound_lines=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(peer.serve)
        # The one line of credit goes to a line that is never read (the writer blocks on it).
        await peer.notify("first")
        sender = trio.CancelScope()

        async def send_second() -> None:
            with sender:
                await peer.notify("second")

        nursery.start_soon(send_second)
        await trio.testing.wait_all_tasks_blocked()
        # Cancelled, and in the same step (before it runs again) the connection ends.
        sender.cancel()
        await peer.aclose()
    await theirs.aclose()


async def test_goal_cycles_of_a_revoked_lease_end_without_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Soak finding: a client gone while its session's goal was about to cycle revoked the
    lease between the driver's wake-up and its history read; the driver logged
    ``ERROR goal cycles of task ... stopped`` with a traceback for what is a normal disconnect."""
    import logging

    from maple_acp.testing.demo import demo_service

    caplog.set_level(logging.INFO, logger="maple_acp")
    project = tmp_path / "project"
    project.mkdir()
    async with demo_service(tmp_path) as service, trio.open_nursery() as nursery:
        lease = await nursery.start(service.serve_new_task, os.fspath(project))
        await lease.set_goal("complete after 9999")
        # The driver has been woken and has not run yet: the connection goes now.
        lease.revoke("the connection ended")
        await lease.release(close=False)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
