"""Real processes for the end-to-end tests: a host (``maple-acp serve`` or an example) started as
a subprocess whose stderr is read line by line, and a connector subprocess driven by an
AcpTestClient.

A module of its own with a name no other test directory uses, so that tests outside
``tests/e2e`` import it as ``e2e.host_processes`` and get the same module the end-to-end tests
use: ``tests`` is on the import path because pytest puts the directory of
``tests/conftest.py`` there (no ``__init__.py`` beside it) before collecting anything.

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
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio

from maple_acp.cli import READY_PREFIX, CliError, query_status
from maple_acp.testing.client import AcpTestClient, open_acp_client

#: Bounds a hang; every step of these tests takes well under a second.
DEADLINE = 20.0
SERVE = [sys.executable, "-m", "maple_acp._main", "serve"]
MAPLE_ACP = [sys.executable, "-m", "maple_acp._main"]
CONNECTOR = [sys.executable, "-m", "maple_acp_connector"]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

__all__ = [
    "CONNECTOR",
    "DEADLINE",
    "MAPLE_ACP",
    "SERVE",
    "Connector",
    "Host",
    "LineReader",
    "assert_only_protocol_lines",
    "clean_env",
    "connector_client",
    "example_command",
    "home_env",
    "private_short_dir",
    "run_command",
    "running_host",
    "serving_process",
    "start_host_process",
    "start_logged_process",
]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without endpoint or relay overrides from the outside."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("MAPLE_ACP_SOCKET", "MAPLE_ACP_RELAY_ENV")
    }
    env.update(extra)
    return env


def home_env(home: Path, **extra: str) -> dict[str, str]:
    """A fresh account's environment: ``HOME`` is ``home``, and no XDG or maple-acp settings
    come from outside."""
    env = {
        key: value
        for key, value in clean_env().items()
        if not key.startswith(("MAPLE_ACP_", "XDG_"))
    }
    env.update(HOME=os.fspath(home), **extra)
    return env


def run_command(
    command: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    input: str | None = None,
    timeout: float = DEADLINE,
) -> subprocess.CompletedProcess[str]:
    """Run a short-lived command to its end (``clean_env()`` unless ``env``), text captured."""
    return subprocess.run(
        list(command),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env() if env is None else env,
        check=False,
    )


def example_command(example: str, socket_path: Path, data_dir: Path) -> list[str]:
    """The documented command of ``examples/<example>``: a host on ``socket_path``."""
    return [
        sys.executable,
        os.fspath(EXAMPLES / example),
        *("--socket", os.fspath(socket_path), "--data-dir", os.fspath(data_dir)),
    ]


@contextmanager
def private_short_dir(prefix: str = "macp-") -> Iterator[Path]:
    """A private scratch directory with a short path: a socket path must fit in sun_path."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


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
        return self.lines[await self.wait_index(predicate)]

    async def wait_index(self, predicate: Callable[[str], bool], start: int = 0) -> int:
        """The index of the first line from ``start`` on that satisfies ``predicate``, once
        it has arrived."""
        seen = start
        while True:
            for index in range(seen, len(self.lines)):
                if predicate(self.lines[index]):
                    return index
            seen = max(seen, len(self.lines))
            if self.closed:
                raise AssertionError(f"stream ended without the awaited line: {self.lines!r}")
            await self._changed.wait()

    async def wait_closed(self) -> None:
        while not self.closed:
            await self._changed.wait()

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


async def start_logged_process(
    nursery: trio.Nursery,
    command: Sequence[str],
    *,
    env: dict[str, str],
    ready: Callable[[str], bool] | None = None,
    stdout: int = subprocess.DEVNULL,
) -> tuple[trio.Process, LineReader]:
    """Start ``command`` in ``nursery`` with its stderr read into a LineReader; with ``ready``,
    return once a stderr line satisfies it (within ``DEADLINE``)."""
    process: trio.Process = await nursery.start(
        partial(
            trio.run_process,
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
            check=False,
            env=env,
        )
    )
    assert process.stderr is not None
    stderr = LineReader()
    nursery.start_soon(stderr.pump, process.stderr)
    if ready is not None:
        with trio.fail_after(DEADLINE):
            await stderr.wait_for(ready)
    return process, stderr


@asynccontextmanager
async def serving_process(
    command: Sequence[str],
    *,
    env: dict[str, str],
    ready: Callable[[str], bool],
    stop_signal: int = signal.SIGTERM,
    stdout: int = subprocess.DEVNULL,
) -> AsyncIterator[tuple[trio.Process, LineReader]]:
    """A long-running process, ready (see ``start_logged_process``) until the block ends; then
    ``stop_signal`` unless it already exited, and its exit and the end of its stderr are
    awaited. The exit code is the caller's to check (``process.returncode``)."""
    async with trio.open_nursery() as nursery:
        process, stderr = await start_logged_process(
            nursery, command, env=env, ready=ready, stdout=stdout
        )
        try:
            yield process, stderr
        finally:
            if process.returncode is None:
                process.send_signal(stop_signal)
            with trio.fail_after(DEADLINE):
                await process.wait()
                await stderr.wait_closed()


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


def _serve_command(directory: Path, args: Sequence[str]) -> tuple[list[str], Path]:
    socket = directory / "run" / "acp.sock"
    command = [
        *SERVE,
        *("--socket", os.fspath(socket), "--data-dir", os.fspath(directory / "data")),
        *args,
    ]
    return command, socket


def _is_ready(line: str) -> bool:
    return line.startswith(READY_PREFIX)


@asynccontextmanager
async def running_host(
    directory: Path, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[Host]:
    """``maple-acp serve`` on ``directory/run/acp.sock`` with ``directory/data`` (``env``,
    default ``clean_env()``); SIGTERM at the end unless the test already ended it."""
    command, socket = _serve_command(directory, args)
    async with serving_process(
        command,
        env=clean_env() if env is None else env,
        ready=_is_ready,
        stdout=subprocess.PIPE,
    ) as (process, stderr):
        yield Host(process, socket, stderr)


async def start_host_process(nursery: trio.Nursery, directory: Path, *args: str) -> Host:
    """Start ``maple-acp serve`` without waiting for its ready line (for refusal tests)."""
    command, socket = _serve_command(directory, args)
    process, stderr = await start_logged_process(
        nursery, command, env=clean_env(), stdout=subprocess.PIPE
    )
    return Host(process, socket, stderr)


class Connector:
    """A connector subprocess and the AcpTestClient speaking over its stdin/stdout."""

    def __init__(self, process: trio.Process, client: AcpTestClient, stderr: LineReader) -> None:
        self.process = process
        self.client = client
        self.stderr = stderr


@asynccontextmanager
async def connector_client(
    socket: Path,
    *,
    env: dict[str, str] | None = None,
    command: Sequence[str] = CONNECTOR,
    **client_options: Any,
) -> AsyncIterator[Connector]:
    """A real connector subprocess (``command``) bridged to ``socket``, driven by an
    AcpTestClient; ``env`` adds to the connector's environment.

    Leaving the block closes the connector's stdin and stdout and waits for it to exit.
    """
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                [*command, "--socket", os.fspath(socket)],
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


def answer_index(client: AcpTestClient, request_id: int) -> int:
    """Where the answer to request ``request_id`` sits among the client's frames."""
    return next(
        i
        for i, frame in enumerate(client.frames)
        if frame.direction == "in"
        and isinstance(frame.message, dict)
        and frame.message.get("id") == request_id
        and "method" not in frame.message
    )


def updates_after(client: AcpTestClient, sid: str, index: int) -> list[Any]:
    """The updates for ``sid`` that arrived after frame ``index``."""
    return [
        frame.message
        for frame in client.frames[index + 1 :]
        if frame.direction == "in"
        and isinstance(frame.message, dict)
        and frame.message.get("method") == "session/update"
        and frame.message["params"]["sessionId"] == sid
    ]
