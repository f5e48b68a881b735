"""``examples/asyncio_guest_host.py``: Trio in guest mode on an asyncio loop serves a session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import trio

from maple_acp.testing.schema import AcpSchema

from .conftest import DEADLINE, LineReader, clean_env, connector_client

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "asyncio_guest_host.py"


async def test_guest_mode_example_serves_a_prompt(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    socket_path = short_dir / "run" / "acp.sock"
    command = [
        sys.executable,
        os.fspath(EXAMPLE),
        *("--socket", os.fspath(socket_path), "--data-dir", os.fspath(short_dir / "data")),
    ]
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            host: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    command,
                    stdin=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    check=False,
                    env=clean_env(),
                )
            )
            assert host.stderr is not None
            stderr = LineReader()
            nursery.start_soon(stderr.pump, host.stderr)
            await stderr.wait_for(lambda line: line.startswith("example host: serving on"))

            async with connector_client(socket_path) as connector:
                client = connector.client
                await client.initialize()
                session_id = (await client.new_session(os.fspath(project)))["sessionId"]
                answer = await client.prompt(session_id, "hello from the guest-mode test")
                assert answer["stopReason"] == "end_turn"
                assert client.text(session_id) == "hello from the guest-mode test"
                # The asyncio side reads the runtime synchronously and saw the session.
                await stderr.wait_for(lambda line: "sessions=1" in line)
                client.validate(acp_schema)

            host.send_signal(signal.SIGINT)
            assert await host.wait() == 0
            await stderr.wait_closed()
    assert stderr.lines[-1] == "example host: stopped"
    assert not socket_path.exists()
    assert not any("Traceback" in line for line in stderr.lines)


async def test_the_documented_command_creates_its_directories_private(short_dir: Path) -> None:
    """The docs' command names directories that do not exist yet: both are made 0700 (and
    the parent they share), so the socket directory is not refused afterwards."""
    base = short_dir / "demo"
    command = [
        sys.executable,
        os.fspath(EXAMPLE),
        *("--socket", os.fspath(base / "acp.sock"), "--data-dir", os.fspath(base / "data")),
    ]
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            host: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    command,
                    stdin=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    check=False,
                    env=clean_env(),
                )
            )
            assert host.stderr is not None
            stderr = LineReader()
            nursery.start_soon(stderr.pump, host.stderr)
            await stderr.wait_for(lambda line: line.startswith("example host: serving on"))
            for directory in (base, base / "data"):
                assert directory.stat().st_mode & 0o777 == 0o700, directory
            host.send_signal(signal.SIGINT)
            assert await host.wait() == 0


def test_a_shared_directory_is_refused_in_one_line_with_the_fix(short_dir: Path) -> None:
    base = short_dir / "demo"
    base.mkdir()
    base.chmod(0o755)
    done = subprocess.run(
        [
            sys.executable,
            os.fspath(EXAMPLE),
            *("--socket", os.fspath(base / "acp.sock"), "--data-dir", os.fspath(base / "data")),
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env=clean_env(),
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr == (
        f"example host: cannot use the socket directory {base}: its mode 0755 grants access "
        f"to group or others; make it private with: chmod 700 {base}\n"
    )
    assert not (base / "data").exists()
