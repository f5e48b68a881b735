"""``examples/asyncio_guest_host.py``: Trio in guest mode on an asyncio loop serves a session."""

from __future__ import annotations

import os
import signal
from pathlib import Path

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

EXAMPLE = "asyncio_guest_host.py"


def _is_ready(line: str) -> bool:
    return line.startswith("example host: serving on")


async def test_guest_mode_example_serves_a_prompt(
    short_dir: Path, project: Path, acp_schema: AcpSchema
) -> None:
    socket_path = short_dir / "run" / "acp.sock"
    command = example_command(EXAMPLE, socket_path, short_dir / "data")
    with trio.fail_after(DEADLINE):
        async with (
            serving_process(
                command, env=clean_env(), ready=_is_ready, stop_signal=signal.SIGINT
            ) as (host, stderr),
            connector_client(socket_path) as connector,
        ):
            client = connector.client
            await client.initialize()
            session_id = (await client.new_session(os.fspath(project)))["sessionId"]
            answer = await client.prompt(session_id, "hello from the guest-mode test")
            assert answer["stopReason"] == "end_turn"
            assert client.text(session_id) == "hello from the guest-mode test"
            # The asyncio side reads the runtime synchronously and saw the session.
            await stderr.wait_for(lambda line: "sessions=1" in line)
            client.validate(acp_schema)
    assert host.returncode == 0, stderr.text
    assert stderr.lines[-1] == "example host: stopped"
    assert not socket_path.exists()
    assert not any("Traceback" in line for line in stderr.lines)


async def test_the_documented_command_creates_its_directories_private(short_dir: Path) -> None:
    """The docs' command names directories that do not exist yet: both are made 0700 (and
    the parent they share), so the socket directory is not refused afterwards."""
    base = short_dir / "demo"
    command = example_command(EXAMPLE, base / "acp.sock", base / "data")
    with trio.fail_after(DEADLINE):
        async with serving_process(
            command, env=clean_env(), ready=_is_ready, stop_signal=signal.SIGINT
        ) as (host, stderr):
            for directory in (base, base / "data"):
                assert directory.stat().st_mode & 0o777 == 0o700, directory
    assert host.returncode == 0, stderr.text


def test_a_shared_directory_is_refused_in_one_line_with_the_fix(short_dir: Path) -> None:
    base = short_dir / "demo"
    base.mkdir()
    base.chmod(0o755)
    done = run_command(example_command(EXAMPLE, base / "acp.sock", base / "data"))
    assert done.returncode == 1
    assert done.stderr == (
        f"example host: cannot use the socket directory {base}: its mode 0755 grants access "
        f"to group or others; make it private with: chmod 700 {base}\n"
    )
    assert not (base / "data").exists()
