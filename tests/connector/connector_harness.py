"""Real connector subprocesses against a tiny in-test host: a listening Unix socket here."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

# Everything in these tests finishes in well under a second; this only bounds a hang.
TIMEOUT = 20.0
CONNECTOR = [sys.executable, "-I", "-m", "maple_acp_connector"]


def connector_env(**extra: str) -> dict[str, str]:
    """A clean environment: no endpoint override or relay list leaks in from the outside."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("MAPLE_ACP_SOCKET", "MAPLE_ACP_RELAY_ENV")
    }
    env.update(extra)
    return env


class Host:
    """A listening socket standing in for the host; tests accept and drive connections by hand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        os.chmod(path, 0o600)
        self.listener.listen(8)

    def accept(self) -> socket.socket:
        self.listener.settimeout(TIMEOUT)
        conn, _ = self.listener.accept()
        conn.settimeout(TIMEOUT)
        return conn

    def has_pending_connection(self) -> bool:
        self.listener.setblocking(False)
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True

    def close(self) -> None:
        self.listener.close()


def read_until_eof(conn: socket.socket) -> bytes:
    chunks = bytearray()
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return bytes(chunks)
        chunks += chunk


def read_exactly(conn: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = conn.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def read_line(conn: socket.socket) -> bytes:
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            break
        data += chunk
    return bytes(data)


class Background:
    """Run a function in a thread and collect its result (or exception) with a timeout."""

    def __init__(self, target: Callable[[], object]) -> None:
        self._target = target
        self._result: object = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._target()
        except BaseException as exc:
            self._error = exc

    def result(self) -> object:
        self._thread.join(TIMEOUT)
        assert not self._thread.is_alive(), "background work did not finish"
        if self._error is not None:
            raise self._error
        return self._result


class Client:
    """The ACP client's side of a connector subprocess: its stdin and stdout.

    ``stdio="pipe"`` gives the connector pipes (what most clients do); ``"socketpair"`` gives it
    connected sockets, as clients built on libuv do.
    """

    def __init__(
        self,
        args: list[str],
        *,
        env: Mapping[str, str],
        stdio: str = "pipe",
        command: list[str] | None = None,
    ) -> None:
        argv = [*(CONNECTOR if command is None else command), *args]
        if stdio == "pipe":
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env),
            )
            assert self.proc.stdin is not None
            assert self.proc.stdout is not None
            self._in_fd = self.proc.stdin.fileno()
            self._out_fd = self.proc.stdout.fileno()
            self._in_sock: socket.socket | None = None
        elif stdio == "socketpair":
            ours_in, theirs_in = socket.socketpair()
            ours_out, theirs_out = socket.socketpair()
            self.proc = subprocess.Popen(
                argv, stdin=theirs_in, stdout=theirs_out, stderr=subprocess.PIPE, env=dict(env)
            )
            theirs_in.close()
            theirs_out.close()
            self._in_sock = ours_in
            self._out_sock = ours_out
            self._in_fd = ours_in.fileno()
            self._out_fd = ours_out.fileno()
        else:
            raise ValueError(stdio)
        self._stdin_open = True
        self._stdout_open = True

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._in_fd, view) :]

    def close_stdin(self) -> None:
        if not self._stdin_open:
            return
        self._stdin_open = False
        if self._in_sock is not None:
            self._in_sock.shutdown(socket.SHUT_WR)
        else:
            assert self.proc.stdin is not None
            self.proc.stdin.close()

    def close_stdout(self) -> None:
        if not self._stdout_open:
            return
        self._stdout_open = False
        if self._in_sock is not None:
            self._out_sock.close()
        else:
            assert self.proc.stdout is not None
            self.proc.stdout.close()

    def read(self, count: int) -> bytes:
        data = bytearray()
        while len(data) < count:
            chunk = os.read(self._out_fd, count - len(data))
            if not chunk:
                break
            data += chunk
        return bytes(data)

    def read_all(self) -> bytes:
        data = bytearray()
        while chunk := os.read(self._out_fd, 65536):
            data += chunk
        return bytes(data)

    def wait(self) -> tuple[int, str]:
        """Exit status and stderr; stdin is left as it is."""
        assert self.proc.stderr is not None
        err = Background(self.proc.stderr.read)
        status = self.proc.wait(TIMEOUT)
        stderr = err.result()
        assert isinstance(stderr, bytes)
        return status, stderr.decode()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(TIMEOUT)
        self.close_stdin()
        self.close_stdout()
        if self._in_sock is not None:
            self._in_sock.close()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def run_connector(
    *args: str, env: Mapping[str, str] | None = None, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """Run a connector to completion (for the cases that never relay)."""
    return subprocess.run(
        [*CONNECTOR, *args],
        input=stdin,
        capture_output=True,
        env=dict(connector_env() if env is None else env),
        timeout=TIMEOUT,
        check=False,
    )
