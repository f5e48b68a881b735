"""Real processes: ``maple-acp serve`` and connector subprocesses driven by AcpTestClient.

Nothing here sleeps to synchronise: a test waits for a line on a process's stderr, for a
frame to arrive, or polls the host's ``_maple/status`` in a loop, always under one deadline
(``DEADLINE``) that only bounds a hang.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from maple_acp.cli import READY_PREFIX, CliError, query_status
from maple_acp.testing.client import AcpTestClient, open_acp_client
from maple_acp.testing.schema import AcpSchema, find_schema_dir

#: Bounds a hang; every step of these tests takes well under a second.
DEADLINE = 20.0
SERVE = [sys.executable, "-m", "maple_acp._main", "serve"]
MAPLE_ACP = [sys.executable, "-m", "maple_acp._main"]
CONNECTOR = [sys.executable, "-m", "maple_acp_connector"]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without endpoint or relay overrides from the outside."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("MAPLE_ACP_SOCKET", "MAPLE_ACP_RELAY_ENV")
    }
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def acp_schema() -> AcpSchema:
    directory = find_schema_dir()
    if directory is None:
        pytest.skip("ACP schema not found: set ACP_SCHEMA_DIR to the acp-schema/v1 directory")
    return AcpSchema(directory)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private scratch directory with a short path: a socket path must fit in sun_path."""
    path = Path(tempfile.mkdtemp(prefix="macp-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def project(short_dir: Path) -> Path:
    directory = short_dir / "project"
    directory.mkdir()
    return directory


class LineReader:
    """Collects a process's stderr lines; ``wait_for`` waits until one matches."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.closed = False
        self._changed = trio.Event()

    async def pump(self, stream: trio.abc.ReceiveStream) -> None:
        partial_line = b""
        try:
            while data := await stream.receive_some(65536):
                *complete, partial_line = (partial_line + data).split(b"\n")
                self.lines.extend(line.decode(errors="replace") for line in complete)
                self._wake()
            if partial_line:
                self.lines.append(partial_line.decode(errors="replace"))
        finally:
            self.closed = True
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, predicate: Callable[[str], bool]) -> str:
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if predicate(line):
                    return line
            seen = len(self.lines)
            if self.closed:
                raise AssertionError(f"stream ended without the awaited line: {self.lines!r}")
            await self._changed.wait()

    async def wait_closed(self) -> None:
        while not self.closed:
            await self._changed.wait()

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


class Host:
    """A running ``maple-acp serve`` subprocess."""

    def __init__(self, process: trio.Process, socket: Path, stderr: LineReader) -> None:
        self.process = process
        self.socket = socket
        self.stderr = stderr

    async def status(self) -> dict[str, Any]:
        return await trio.to_thread.run_sync(query_status, self.socket)

    async def wait_status(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Poll ``_maple/status`` until ``predicate`` holds (bounded by the test deadline)."""
        while True:
            try:
                current = await self.status()
            except CliError:
                current = None
            if current is not None and predicate(current):
                return current
            await trio.sleep(0.02)

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)


async def _start_host(
    nursery: trio.Nursery, directory: Path, *args: str, wait_ready: bool = True
) -> Host:
    socket = directory / "run" / "acp.sock"
    command = [
        *SERVE,
        "--socket",
        os.fspath(socket),
        "--data-dir",
        os.fspath(directory / "data"),
        *args,
    ]
    process: trio.Process = await nursery.start(
        partial(
            trio.run_process,
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            check=False,
            env=clean_env(),
        )
    )
    stderr = LineReader()
    assert process.stderr is not None
    nursery.start_soon(stderr.pump, process.stderr)
    host = Host(process, socket, stderr)
    if wait_ready:
        with trio.fail_after(DEADLINE):
            await stderr.wait_for(lambda line: line.startswith(READY_PREFIX))
    return host


@asynccontextmanager
async def running_host(directory: Path, *args: str) -> AsyncIterator[Host]:
    """``maple-acp serve`` on ``directory/run/acp.sock`` with ``directory/data``; SIGTERM at
    the end unless the test already ended it."""
    async with trio.open_nursery() as nursery:
        host = await _start_host(nursery, directory, *args)
        try:
            yield host
        finally:
            if host.process.returncode is None:
                host.send_signal(signal.SIGTERM)
            with trio.fail_after(DEADLINE):
                await host.process.wait()


async def start_host_process(nursery: trio.Nursery, directory: Path, *args: str) -> Host:
    """Start ``maple-acp serve`` without waiting for its ready line (for refusal tests)."""
    return await _start_host(nursery, directory, *args, wait_ready=False)


class Connector:
    """A connector subprocess and the AcpTestClient speaking over its stdin/stdout."""

    def __init__(self, process: trio.Process, client: AcpTestClient, stderr: LineReader) -> None:
        self.process = process
        self.client = client
        self.stderr = stderr


@asynccontextmanager
async def connector_client(
    socket: Path, *, env: dict[str, str] | None = None, **client_options: Any
) -> AsyncIterator[Connector]:
    """A real connector subprocess bridged to ``socket``, driven by an AcpTestClient; ``env``
    adds to the connector's environment.

    Leaving the block closes the connector's stdin and stdout and waits for it to exit.
    """
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                [*CONNECTOR, "--socket", os.fspath(socket)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                check=False,
                env=clean_env(**(env or {})),
            )
        )
        assert process.stdin is not None
        assert process.stdout is not None
        assert process.stderr is not None
        stderr = LineReader()
        nursery.start_soon(stderr.pump, process.stderr)
        stream = trio.StapledStream(process.stdin, process.stdout)
        async with open_acp_client(stream, **client_options) as client:
            yield Connector(process, client, stderr)
        with trio.fail_after(DEADLINE):
            await process.wait()


def assert_only_protocol_lines(client: AcpTestClient) -> None:
    """Everything the connector wrote on stdout was a JSON-RPC 2.0 frame."""
    inbound = [frame for frame in client.frames if frame.direction == "in"]
    assert inbound, "nothing arrived"
    for frame in inbound:
        message = frame.message
        assert isinstance(message, dict), frame.raw[:200]
        assert message.get("jsonrpc") == "2.0", frame.raw[:200]
        assert "method" in message or "result" in message or "error" in message, message
