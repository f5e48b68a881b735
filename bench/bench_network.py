"""Host CPU per streamed ``session/update``: over a WebSocket (``serve --http``) against the
Unix socket, side by side on one host.

Run: ``python bench/bench_network.py [--updates N] [--size B] [--runs R]``. One ``maple-acp
serve --http 127.0.0.1:0`` runs for the whole bench; a client on its Unix socket (no connector:
the socket path itself) and a client on its WebSocket each open a session, and their prompts
(``/stream N B`` for the demo backend) alternate R times, so that a slow moment of the machine
hits both. The host's CPU (user + system, from ``/proc``) is read before and after each prompt;
the clients' own CPU is not counted. Both clients count the streamed text the same way.

Target: the WebSocket's CPU per update at most 1.2x the Unix socket's. The peer hands both
the same batches of messages (the socket's transport frames them as lines, the WebSocket's
carries them whole) and our WebSocket stream frames and writes a batch at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_throughput import PYTHON, TIMEOUT_S, LineClient, Side

#: What the host logs once the network listener is up (the URL follows).
SERVING_AT = b"serving ACP over WebSocket and HTTP at "


class WebSocketLines:
    """A binary-file look-alike over a blocking WebSocket, so that :class:`LineClient` drives
    it as it drives a pipe: each message is one line."""

    def __init__(self, url: str, token: str) -> None:
        from websockets.sync.client import connect

        self._opened = connect(
            url.replace("http", "ws", 1),
            additional_headers={"Authorization": f"Bearer {token}"},
            max_size=None,
        )
        self._ws = self._opened.__enter__()
        self._pending = b""

    def write(self, data: bytes) -> None:
        self._pending += data

    def flush(self) -> None:
        for line in self._pending.splitlines():
            self._ws.send(line.decode())
        self._pending = b""

    def readline(self) -> bytes:
        message = self._ws.recv()
        return (message.encode() if isinstance(message, str) else message) + b"\n"

    def close(self) -> None:
        self._opened.__exit__(None, None, None)


@contextmanager
def network_host(scratch: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, str, str]]:
    socket_path = scratch / "run" / "acp.sock"
    data = scratch / "data"
    host = subprocess.Popen(
        [
            *(PYTHON, "-m", "maple_acp._main", "serve", "--socket", str(socket_path)),
            *("--data-dir", str(data), "--http", "127.0.0.1:0"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    drain: subprocess.Popen[bytes] | None = None
    try:
        assert host.stderr is not None
        url = ""
        while True:
            line = host.stderr.readline()
            if not line:
                raise RuntimeError("maple-acp serve exited before it was ready")
            if SERVING_AT in line:
                url = line.split(SERVING_AT, 1)[1].strip().decode()
            if line.startswith(b"maple-acp: serving on "):
                break
        # The host logs a line per prompt at INFO: drain them so it never blocks on stderr.
        stderr = host.stderr
        drain = subprocess.Popen(["cat"], stdin=stderr, stdout=subprocess.DEVNULL)
        token = subprocess.run(
            [PYTHON, "-m", "maple_acp._main", "http-token", "--data-dir", str(data)],
            capture_output=True,
            check=True,
            text=True,
        ).stdout.strip()
        yield host, socket_path, url, token
    finally:
        host.send_signal(signal.SIGTERM)
        host.wait(timeout=TIMEOUT_S)
        if drain is not None:
            drain.wait(timeout=TIMEOUT_S)


def unix_side(socket_path: Path, pid: int, cwd: str) -> tuple[Side, Any]:
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(socket_path))
    reader, writer = sock.makefile("rb"), sock.makefile("wb")
    return Side(LineClient(writer, reader), [pid], cwd), sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="macp-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        project = scratch / "project"
        project.mkdir()
        with network_host(scratch) as (host, socket_path, url, token):
            unix, sock = unix_side(socket_path, host.pid, str(project))
            lines = WebSocketLines(url, token)
            ws = Side(LineClient(lines, lines), [host.pid], str(project))  # type: ignore[arg-type]
            # A first prompt each warms the codecs and the store; it is not counted.
            unix.prompt(args.updates, args.size)
            ws.prompt(args.updates, args.size)
            unix.cpu_per_update.clear()
            ws.cpu_per_update.clear()
            unix.rates.clear()
            ws.rates.clear()
            for _ in range(args.runs):
                unix.prompt(args.updates, args.size)
                ws.prompt(args.updates, args.size)
            lines.close()
            sock.close()
    per_unix = statistics.median(unix.cpu_per_update) * 1e6
    per_ws = statistics.median(ws.cpu_per_update) * 1e6
    print(f"{args.runs} prompts of {args.updates} updates of {args.size} bytes each way")
    print(f"unix socket: {per_unix:6.2f} us host CPU per update, "
          f"{statistics.median(unix.rates):9.0f} updates/s")  # fmt: skip
    print(f"websocket:   {per_ws:6.2f} us host CPU per update, "
          f"{statistics.median(ws.rates):9.0f} updates/s")  # fmt: skip
    ratio = per_ws / per_unix if per_unix else float("inf")
    print(f"websocket / unix socket: {ratio:.2f}x (target <= 1.2x)")


if __name__ == "__main__":
    main()
