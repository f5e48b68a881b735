"""Connector and host start-up against a bare interpreter, relay throughput against a socket.

Run: ``python bench/bench_connector_startup.py [--runs N] [--serve-runs N] [--mib M]``. Prints
plain text; the ratios measured in one run are what count (absolute figures move between runs).

Start-up: ``--version`` through ``python -I -m maple_acp_connector`` and the installed commands,
against ``python -I -c pass`` (target: at most 1.5x). ``maple-acp-connector`` is installed as a
plain script; ``maple-acp`` is a generated entry point (which imports ``re`` first). Also a
whole relay life: start, connect to a listening socket, see the host close, exit. And
``maple-acp serve`` to its ready line against ``python -I -c "import trio"`` (target: 4x).

Throughput: a sender process writes M MiB to every connection on a Unix socket; we time from
the first byte to the end of the stream when reading the socket directly, and when reading the
stdout pipe of a connector relaying it: with splice in two threads (what ships), with plain
reads and writes, and with splice in a single-threaded poll loop (the alternative design).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

PYTHON = sys.executable
BIN = Path(PYTHON).parent
CHUNK = 64 * 1024

SENDER = """
import os, socket, sys
path, total = sys.argv[1], int(sys.argv[2])
listener = socket.socket(socket.AF_UNIX)
listener.bind(path)
os.chmod(path, 0o600)
listener.listen(8)
print("ready", flush=True)
block = memoryview(os.urandom(65536))
while True:
    conn, _ = listener.accept()
    left = total
    while left:
        left -= conn.send(block[: min(left, 65536)])
    conn.close()
"""

# The alternative design, measured here only: one thread, one poll loop, splice both ways,
# every descriptor driven without blocking, and each write tried at once before polling for it.
SINGLE_THREAD_RELAY = """
import os, select, socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
sock.setblocking(False)
S = sock.fileno()
N = 65536
FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
IN = select.POLLIN | select.POLLHUP
up_r, up_w = os.pipe()
down_r, down_w = os.pipe()
up = down = 0
stdin_open = True
poller = select.poll()
masks = {}

def want(fd, mask):
    old = masks.get(fd, 0)
    if mask == old:
        return
    if not old:
        poller.register(fd, mask)
    elif mask:
        poller.modify(fd, mask)
    else:
        poller.unregister(fd)
    masks[fd] = mask

def flush(src, dst, count):
    try:
        while count:
            count -= os.splice(src, dst, count, flags=FLAGS)
    except BlockingIOError:
        pass
    return count

while True:
    want(0, IN if stdin_open and not up else 0)
    want(S, (select.POLLOUT if up else 0) | (0 if down else IN))
    want(1, select.POLLOUT if down else 0)
    for fd, _ in poller.poll():
        if fd == 0 and stdin_open and not up:
            try:
                n = os.splice(0, up_w, N, flags=FLAGS)
            except BlockingIOError:
                continue
            if n == 0:
                stdin_open = False
                sock.shutdown(socket.SHUT_WR)
            up = flush(up_r, S, n)
        elif fd == S:
            if up:
                up = flush(up_r, S, up)
            if not down:
                try:
                    n = os.splice(S, down_w, N, flags=FLAGS)
                except BlockingIOError:
                    continue
                if n == 0:
                    sys.exit(0)
                down = flush(down_r, 1, n)
        elif fd == 1 and down:
            down = flush(down_r, 1, down)
"""

COPY_ONLY_RELAY = (
    "import sys; from maple_acp_connector._relay import run; "
    "sys.exit(run(sys.argv[1], use_splice=False))"
)


def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MAPLE_ACP_RELAY_ENV", None)
    env.pop("MAPLE_ACP_SOCKET", None)
    return env


def time_interleaved(commands: dict[str, list[str]], runs: int) -> dict[str, float]:
    """Median wall time of each command in ms, runs taken in turn so that load hits all alike."""
    samples: dict[str, list[float]] = {label: [] for label in commands}
    env = clean_env()
    for _ in range(runs):
        for label, argv in commands.items():
            start = time.perf_counter()
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                check=False,
            )
            samples[label].append((time.perf_counter() - start) * 1000)
    return {label: statistics.median(values) for label, values in samples.items()}


def closing_host(path: str) -> socket.socket:
    """A listener that closes every connection at once: a connector's shortest possible life."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener


def bench_startup(runs: int, workdir: Path) -> None:
    path = str(workdir / "closing.sock")
    commands = {
        "python -I -c pass": [PYTHON, "-I", "-c", "pass"],
        "python -c pass (how installed commands start)": [PYTHON, "-c", "pass"],
        # -m itself imports runpy and importlib.util: the floor for any `python -m` command.
        "python -I -m stat (does nothing)": [PYTHON, "-I", "-m", "stat"],
        "python -I -m maple_acp_connector --version": [
            PYTHON,
            "-I",
            "-m",
            "maple_acp_connector",
            "--version",
        ],
        "maple-acp-connector --version": [str(BIN / "maple-acp-connector"), "--version"],
        "maple-acp --version": [str(BIN / "maple-acp"), "--version"],
        "maple-acp acp --version": [str(BIN / "maple-acp"), "acp", "--version"],
        "relay life (-I -m): start, connect, closed": [
            PYTHON,
            "-I",
            "-m",
            "maple_acp_connector",
            "--socket",
            path,
        ],
        "relay life (maple-acp-connector)": [str(BIN / "maple-acp-connector"), "--socket", path],
    }
    commands = {label: argv for label, argv in commands.items() if Path(argv[0]).exists()}
    listener = closing_host(path)
    try:
        time_interleaved(commands, 2)  # warm the page cache and bytecode caches
        medians = time_interleaved(commands, runs)
    finally:
        listener.close()
        os.unlink(path)
    baseline = medians["python -I -c pass"]
    print(f"start-up, median of {runs} interleaved runs")
    for label, took in medians.items():
        print(f"  {label:44} {took:7.2f} ms   {took / baseline:4.2f}x python -I -c pass")
    print("  target: --version at most 1.5x python -I -c pass")


def serve_to_ready(workdir: Path, env: dict[str, str]) -> float:
    """Milliseconds from starting ``maple-acp serve`` to its ready line (it is listening)."""
    command = [str(BIN / "maple-acp"), "serve", "--socket", str(workdir / "serve" / "acp.sock")]
    command += ["--data-dir", str(workdir / "serve-data"), "--log-level", "warning"]
    start = time.perf_counter()
    host = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert host.stderr is not None
        for line in host.stderr:
            if line.startswith(b"maple-acp: serving on "):
                return (time.perf_counter() - start) * 1000
        raise RuntimeError("maple-acp serve exited before it was ready")
    finally:
        host.send_signal(signal.SIGTERM)
        host.wait(timeout=30)


def bench_serve_startup(runs: int, workdir: Path) -> None:
    """``maple-acp serve`` to ready against ``python -I -c "import trio"``, in turn. The data
    directory is kept between starts (a restart, not a first start), and HOME points at an
    empty directory so no configuration file of this machine's user is read."""
    env = clean_env()
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    env["HOME"] = str(home)
    env.pop("XDG_CONFIG_HOME", None)
    env.pop("MAPLE_ACP_DATA_DIR", None)
    serve_to_ready(workdir, env)  # the first start creates the store; warms the caches
    trio_ms: list[float] = []
    serve_ms: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([PYTHON, "-I", "-c", "import trio"], env=env, check=True)
        trio_ms.append((time.perf_counter() - start) * 1000)
        serve_ms.append(serve_to_ready(workdir, env))
    base, took = statistics.median(trio_ms), statistics.median(serve_ms)
    print(f"maple-acp serve to its ready line, median of {runs} alternating runs")
    print(f"  python -I -c 'import trio'                   {base:7.1f} ms")
    print(f"  maple-acp serve -> 'serving on'              {took:7.1f} ms   {took / base:4.2f}x")
    print("  target: at most 4x python -I -c 'import trio'")


def read_stream(fd: int) -> tuple[int, float]:
    """Bytes read from ``fd`` until its end, and seconds from the first byte to the end."""
    buffer = bytearray(CHUNK)
    total = os.readv(fd, [buffer])
    start = time.perf_counter()
    while count := os.readv(fd, [buffer]):
        total += count
    return total, time.perf_counter() - start


def direct(path: str) -> tuple[int, float]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        return read_stream(sock.fileno())


def through(argv: list[str]) -> Callable[[str], tuple[int, float]]:
    def run(path: str) -> tuple[int, float]:
        proc = subprocess.Popen(
            [*argv, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=clean_env(),
        )
        assert proc.stdout is not None
        try:
            return read_stream(proc.stdout.fileno())
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.stdout.close()
            proc.wait()

    return run


def bench_throughput(mib: int, workdir: Path, repeats: int) -> None:
    path = str(workdir / "sender.sock")
    total = mib * 1024 * 1024
    sender = subprocess.Popen(
        [PYTHON, "-c", SENDER, path, str(total)], stdout=subprocess.PIPE, env=clean_env()
    )
    try:
        assert sender.stdout is not None
        sender.stdout.readline()
        variants: list[tuple[str, Callable[[str], tuple[int, float]]]] = [
            ("direct socket read", direct),
            (
                "connector: splice, two threads (shipped)",
                through([PYTHON, "-I", "-m", "maple_acp_connector", "--socket"]),
            ),
            ("connector: read/write, two threads", through([PYTHON, "-I", "-c", COPY_ONLY_RELAY])),
        ]
        if hasattr(os, "splice"):
            variants.append(
                (
                    "splice, one thread, poll loop",
                    through([PYTHON, "-I", "-c", SINGLE_THREAD_RELAY]),
                )
            )
        print(
            f"\nrelay throughput, {mib} MiB, best of {repeats} interleaved runs"
            " (first byte to end of stream)"
        )
        rates = {label: 0.0 for label, _ in variants}
        for _ in range(repeats):
            for label, measure in variants:
                count, seconds = measure(path)
                assert count == total, (label, count, total)
                rates[label] = max(rates[label], count / seconds)
        base = rates["direct socket read"]
        for label, rate in rates.items():
            print(f"  {label:42} {rate / 1e9:6.2f} GB/s   {rate / base:5.2f}x direct")
    finally:
        sender.kill()
        sender.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="start-up runs per command")
    parser.add_argument("--serve-runs", type=int, default=9, help="maple-acp serve starts")
    parser.add_argument("--mib", type=int, default=512, help="MiB per throughput run")
    parser.add_argument("--repeats", type=int, default=5, help="throughput runs per variant")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="macp-bench-", dir="/tmp"))
    try:
        bench_startup(args.runs, workdir)
        bench_serve_startup(args.serve_runs, workdir)
        bench_throughput(args.mib, workdir, args.repeats)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
