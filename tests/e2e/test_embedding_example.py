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
