"""What ``maple-acp serve`` guarantees about its data directory: one host at a time (a second
host exits naming the holder, and the first host's sessions live on), and a deleted session's
text leaves the directory's files as soon as the delete answered."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import trio

from maple_acp.cli import READY_PREFIX
from maple_acp.testing.store import STORE_FILE_NAME

from .host_processes import (
    DEADLINE,
    SERVE,
    clean_env,
    connector_client,
    running_host,
    start_logged_process,
)

#: A phrase nothing else in the data directory can contain.
SECRET = "marmot-umbrella-5be1c0"


def _files_holding(data_dir: Path, text: str) -> list[str]:
    """The data directory's files whose raw bytes contain ``text`` (the store file, its
    ``-wal`` and ``-shm``, the lock file: everything there)."""
    needle = text.encode()
    return sorted(path.name for path in data_dir.iterdir() if needle in path.read_bytes())


async def test_a_second_host_on_the_data_directory_exits_and_the_first_keeps_its_session(
    short_dir: Path, project: Path
) -> None:
    data_dir = short_dir / "data"
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as first, connector_client(first.socket) as connector:
            client = connector.client
            await client.initialize()
            # Never prompted: provisional, the kind a second host's start-up sweep deletes.
            session_id = (await client.new_session(os.fspath(project)))["sessionId"]
            second_command = [
                *SERVE,
                *("--socket", os.fspath(short_dir / "second.sock")),
                *("--data-dir", os.fspath(data_dir)),
            ]
            async with trio.open_nursery() as nursery:
                second, stderr = await start_logged_process(
                    nursery, second_command, env=clean_env()
                )
                # Its first own line: the refusal, or (were it not refused) its ready line.
                said = await stderr.wait_for(lambda line: line.startswith("maple-acp: "))
                if said.startswith(READY_PREFIX):
                    second.send_signal(signal.SIGTERM)
                await second.wait()
                await stderr.wait_closed()
            assert not said.startswith(READY_PREFIX), "a second host served the data directory"
            assert second.returncode == 1
            assert stderr.lines == [said]
            assert os.fspath(data_dir) in said
            assert f"PID {first.process.pid}" in said
            answer = await client.prompt(session_id, "/echo still here")
            assert answer["stopReason"] == "end_turn"
            assert client.text(session_id) == "still here"


async def test_a_deleted_sessions_text_leaves_the_data_directory_at_once(
    short_dir: Path, project: Path
) -> None:
    data_dir = short_dir / "data"
    with trio.fail_after(DEADLINE):
        async with running_host(short_dir) as host, connector_client(host.socket) as connector:
            client = connector.client
            await client.initialize()
            session_id = (await client.new_session(os.fspath(project)))["sessionId"]
            await client.prompt(session_id, f"/echo {SECRET}")
            assert _files_holding(data_dir, SECRET), "the text never reached the disk"
            await client.close_session(session_id)
            assert await client.delete_session(session_id) == {}
            # The host is still running: nothing was cleaned up by a clean stop.
            assert host.process.returncode is None
            assert (data_dir / STORE_FILE_NAME).exists()
            assert _files_holding(data_dir, SECRET) == []
