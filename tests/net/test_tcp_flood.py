"""A real ``maple-acp serve --http`` under a low open-file limit, flooded with TCP connections
that never send a request (held open, and connect-and-close): ``serve`` raised its soft limit
to the hard one, the Unix socket answers ``status`` at once throughout, and the log holds a
line or two about it, never a traceback."""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
from e2e.host_processes import DEADLINE, SERVE, LineReader, clean_env, private_short_dir

from maple_acp.cli import READY_PREFIX, query_status

#: What the host logs once the network listener is up (the URL follows).
SERVING_AT = "serving ACP over WebSocket and HTTP at "
#: The limits the host starts under: a soft limit it must raise, a hard one that leaves it
#: room for fewer network connections than the flood opens.
SOFT_LIMIT = 40
HARD_LIMIT = 90
#: Connections the flood holds open, and those it opens and closes at once.
HELD = 150
CONNECT_AND_CLOSE = 400


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A socket path must fit in sun_path."""
    with private_short_dir() as path:
        yield path


def _low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_LIMIT, HARD_LIMIT))


def _open_file_limits(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-file limit in /proc")


async def test_the_unix_socket_answers_status_while_tcp_connections_flood(
    short_dir: Path,
) -> None:
    socket_path = short_dir / "run" / "acp.sock"
    command = [
        *SERVE,
        *("--socket", os.fspath(socket_path), "--data-dir", os.fspath(short_dir / "data")),
        *("--http", "127.0.0.1:0"),
    ]
    held: list[trio.SocketStream] = []
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                check=False,
                env=clean_env(),
                preexec_fn=_low_limit,
            )
        )
        assert process.stderr is not None
        log = LineReader()
        nursery.start_soon(log.pump, process.stderr)
        try:
            with trio.fail_after(DEADLINE):
                await log.wait_for(lambda line: line.startswith(READY_PREFIX))
                serving = await log.wait_for(lambda line: SERVING_AT in line)
            port = int(serving.rsplit(":", 1)[1].split("/", 1)[0])
            assert _open_file_limits(process.pid) == (HARD_LIMIT, HARD_LIMIT)
            started = len(log.lines)
            with trio.fail_after(DEADLINE):
                for _ in range(HELD):
                    held.append(await trio.open_tcp_stream("127.0.0.1", port))
                for _ in range(CONNECT_AND_CLOSE):
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    await stream.aclose()
            flood_lines = log.lines[started:]
            # The flood is on (HELD connections open): the owner's local door answers at once.
            with trio.fail_after(1.0):
                status = await trio.to_thread.run_sync(partial(query_status, socket_path))
            assert status["running"] is True
        finally:
            for stream in held:
                await stream.aclose()
            process.terminate()
            with trio.fail_after(DEADLINE):
                await process.wait()
                await log.wait_closed()
    assert not [line for line in flood_lines if "Traceback" in line or "ERROR" in line]
    # One line for the refusals (a minute's worth), told once; nothing per connection.
    assert len([line for line in flood_lines if "refused" in line]) == 1
    assert len(flood_lines) <= 2, flood_lines
