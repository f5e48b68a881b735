"""A neighbour without the token floods ``serve --http`` while its owner works: does the owner
lose anything, does the Unix socket keep answering, does the log stay calm, does the host give
back what the flood took?

Run: ``python bench/bench_flood.py [--seconds S] [--connects N] [--wrong M]`` (defaults: 20 s,
2,000 connect-and-close and 1,000 wrong-token requests a second, the figures the listener is
held to). One ``maple-acp serve --http 127.0.0.1:0`` runs at INFO with its log in a file:

- the owner streams over a WebSocket and over Streamable HTTP at once (``bench/net_bridge.py``,
  one process each), one ``/stream`` prompt after another, for the whole flood; every prompt
  must end ``end_turn`` with all its chunks;
- a flood process (this script again, ``--flood``) opens and closes TCP connections and sends
  requests with a wrong bearer token, each at its rate, on fresh connections;
- ``_maple/status`` is asked over the Unix socket every 0.25 s; each answer must come within
  1 s.

It prints the rates reached, the owner's prompts, the slowest status answer, the log lines
the flood added (per minute), and the host's open files and RSS before, right after and 5 s
after the flood; it exits 1 naming every check that failed. The default suite runs it for a
few seconds at lower rates (``tests/soak/test_flood_short.py``); ``nox -s flood`` runs it whole.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import orjson
import trio

PYTHON = sys.executable
HERE = Path(__file__).resolve().parent
#: What the host logs once the network listener is up (the URL follows).
SERVING_AT = "serving ACP over WebSocket and HTTP at "
#: A status answer slower than this fails the run.
STATUS_WITHIN_S = 1.0
#: How often status is asked.
STATUS_EVERY_S = 0.25
#: Each owner prompt: this many chunks of this many bytes.
CHUNKS, CHUNK_BYTES = 20, 200
#: The owner prompts at most this often: a person's pace, and a history that stays within the
#: store's cache for the whole run (past 8 M characters every turn reads it from disk, which
#: would be measured instead of the flood).
OWNER_PROMPT_EVERY_S = 0.1
#: Log lines the flood may add per minute (the first refusal of a kind, the minute's counts,
#: the accept-limit line).
MAX_LOG_LINES_PER_MINUTE = 12
#: Lines the owner's own work and the status probes write (each prompt and connection logs at
#: INFO): not the flood's.
OWN_ACTIVITY = (b"prompt run ", b"ACP connection opened", b"ACP connection closed")
#: Open files and RSS "after" may exceed "before" by this much.
FD_SLACK, RSS_SLACK_KB = 16, 32 * 1024
#: Bounds every wait on the host.
TIMEOUT_S = 30.0


def _flood_lines(log_path: Path) -> int:
    """The log's lines that are not the owner's own activity."""
    lines = log_path.read_bytes().splitlines()
    return sum(1 for line in lines if not any(mark in line for mark in OWN_ACTIVITY))


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _limit_files(limit: int) -> None:
    """The host's open-file limit, soft and hard: the usual 1,024 of a desktop session (this
    machine may allow far more, which would hide an exhaustion)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


# --- the flood (its own process, so its CPU is not the owner's) --------------------------


async def _connect_close(host: str, port: int, rate: int, seconds: float, done: list[int]) -> None:
    # Many at once: a host that stops accepting makes each connect wait for its backlog, and
    # the flood must keep its rate regardless.
    limiter = trio.CapacityLimiter(256)

    async def one() -> None:
        async with limiter:
            sock = trio.socket.socket()
            try:
                with trio.move_on_after(5):
                    await sock.connect((host, port))
                    done[0] += 1
                    return
                done[1] += 1
            except OSError:
                done[1] += 1
            finally:
                sock.close()

    await _at_rate(one, rate, seconds)


async def _at_rate(one: Callable[[], Awaitable[None]], rate: int, seconds: float) -> None:
    """Start ``one`` ``rate`` times a second for ``seconds``; wait at most 5 s more for them."""
    tick = max(0.01, 1.0 / rate)
    per_tick = max(1, round(rate * tick))
    deadline = trio.current_time() + seconds
    next_tick = trio.current_time()
    async with trio.open_nursery() as nursery:
        while trio.current_time() < deadline:
            for _ in range(per_tick):
                nursery.start_soon(one)
            next_tick += tick
            await trio.sleep_until(next_tick)
        nursery.cancel_scope.deadline = trio.current_time() + 5


async def _wrong_token(host: str, port: int, rate: int, seconds: float, done: list[int]) -> None:
    request = (
        f"POST /acp HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer not-the-token\r\n"
        "Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    ).encode()
    limiter = trio.CapacityLimiter(64)

    async def one() -> None:
        async with limiter:
            try:
                with trio.move_on_after(5):
                    stream = await trio.open_tcp_stream(host, port)
                    async with stream:
                        await stream.send_all(request)
                        answer = await stream.receive_some(4096)
                        done[0 if answer[9:12] in (b"401", b"429") else 1] += 1
                        return
                done[1] += 1
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                done[1] += 1

    await _at_rate(one, rate, seconds)


async def flood(host: str, port: int, connects: int, wrong: int, seconds: float) -> None:
    """One kind of flood (this process runs one) at its rate; prints what it reached."""
    counts = [0, 0]
    if connects:
        await _connect_close(host, port, connects, seconds, counts)
        print(
            f"flood: {counts[0]} connect-and-close in {seconds:.0f} s "
            f"({counts[0] / seconds:.0f}/s of {connects}/s asked); "
            f"{counts[1]} connects failed or timed out",
            flush=True,
        )
    if wrong:
        await _wrong_token(host, port, wrong, seconds, counts)
        print(
            f"flood: {counts[0]} wrong-token requests answered 401/429 in {seconds:.0f} s "
            f"({counts[0] / seconds:.0f}/s of {wrong}/s asked); {counts[1]} closed at accept "
            "(the connection cap) or unanswered",
            flush=True,
        )


# --- the owner and the judge ---------------------------------------------------------------


class Owner:
    """One network client (a bridge process) prompting in a loop; counts what it got."""

    def __init__(self, kind: str, url: str, token_file: Path, cwd: str) -> None:
        self.kind = kind
        self.url = url
        self.token_file = token_file
        self.cwd = cwd
        self.prompts = 0
        self.lost: list[str] = []

    async def run(self, stop: trio.Event) -> None:
        command = [PYTHON, str(HERE / "net_bridge.py"), self.kind, self.url, str(self.token_file)]
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    check=False,
                )
            )
            assert process.stdin is not None
            assert process.stdout is not None
            lines = _Lines(process.stdout)
            send = process.stdin.send_all
            try:
                with trio.fail_after(TIMEOUT_S):
                    await send(
                        b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":'
                        b'{"protocolVersion":1,"clientCapabilities":{}}}\n'
                    )
                    await lines.until(b'"id":0')
                    await send(
                        b'{"jsonrpc":"2.0","id":1,"method":"session/new","params":'
                        b'{"cwd":"%s","mcpServers":[]}}\n' % self.cwd.encode()
                    )
                    created = await lines.until(b'"id":1')
                session = orjson.loads(created)["result"]["sessionId"].encode()
                request_id = 2
                while not stop.is_set():
                    prompt = (
                        b'{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":'
                        b'{"sessionId":"%s","prompt":[{"type":"text","text":"/stream %d %d"}]}}\n'
                        % (request_id, session, CHUNKS, CHUNK_BYTES)
                    )
                    chunks = 0
                    with trio.move_on_after(TIMEOUT_S) as waited:
                        await send(prompt)
                        while True:
                            line = await lines.next()
                            if b'"agent_message_chunk"' in line:
                                chunks += _text_length(line)
                            elif b'"id":%d,' % request_id in line or line.endswith(
                                b'"id":%d}' % request_id
                            ):
                                break
                    if waited.cancelled_caught:
                        self.lost.append(f"prompt {request_id} not answered in {TIMEOUT_S:.0f} s")
                        break
                    if b'"end_turn"' not in line or chunks != CHUNKS * CHUNK_BYTES:
                        self.lost.append(
                            f"prompt {request_id}: {chunks}/{CHUNKS * CHUNK_BYTES} characters, "
                            f"answer {line[:200]!r}"
                        )
                    self.prompts += 1
                    request_id += 1
                    await trio.sleep(OWNER_PROMPT_EVERY_S)
            except (trio.TooSlowError, EOFError) as exc:
                self.lost.append(f"the {self.kind} client broke off: {exc!r}")
            finally:
                await process.stdin.aclose()
                with trio.move_on_after(5):
                    await process.wait()
                process.kill()


def _text_length(line: bytes) -> int:
    """The length of a chunk's text (the demo streams ``x``s, nothing to unescape); the host may
    join adjacent chunks into one update, so characters are counted, not updates."""
    start = line.find(b'"text":"') + 8
    return line.find(b'"', start) - start if start >= 8 else 0


class _Lines:
    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> bytes:
        while b"\n" not in self._buffer:
            data = await self._stream.receive_some(65536)
            if not data:
                raise EOFError("the bridge's output ended")
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    async def until(self, marker: bytes) -> bytes:
        while True:
            line = await self.next()
            if marker in line:
                return line


async def judge(args: argparse.Namespace) -> int:
    from maple_acp.cli._client import HostUnavailable, host_status

    scratch = Path(tempfile.mkdtemp(prefix="macp-flood-"))
    socket_path = scratch / "run" / "acp.sock"
    data = scratch / "data"
    project = scratch / "project"
    project.mkdir()
    log_path = scratch / "host.log"
    failures: list[str] = []
    with log_path.open("wb") as log:
        host = subprocess.Popen(  # noqa: ASYNC220 (started once; judged by its pid)
            [
                *(PYTHON, "-m", "maple_acp._main", "serve", "--socket", str(socket_path)),
                *("--data-dir", str(data), "--http", "127.0.0.1:0", "--log-level", "info"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            preexec_fn=partial(_limit_files, args.nofile),
        )
    try:
        url = ""
        with trio.fail_after(TIMEOUT_S):
            while not url or not socket_path.exists():
                await trio.sleep(0.05)
                for line in log_path.read_text(errors="replace").splitlines():
                    if SERVING_AT in line:
                        url = line.split(SERVING_AT, 1)[1].strip()
        netloc = url.split("//", 1)[1].split("/", 1)[0]
        address, port_text = netloc.rsplit(":", 1)
        # The token file: made on first use by the listener, read by the owner's bridges.
        token_file = data / "http-token"
        owners = [Owner(kind, url, token_file, str(project)) for kind in ("ws", "http")]
        stop = trio.Event()
        slowest = [0.0]

        async def probe_status(until: trio.Event) -> None:
            while not until.is_set():
                started = time.monotonic()
                try:
                    await trio.to_thread.run_sync(
                        partial(host_status, socket_path, timeout=5.0, max_bytes=1 << 20)
                    )
                except HostUnavailable as exc:
                    failures.append(f"status over the Unix socket failed: {exc}")
                slowest[0] = max(slowest[0], time.monotonic() - started)
                await trio.sleep(STATUS_EVERY_S)

        async with trio.open_nursery() as nursery:
            for owner in owners:
                nursery.start_soon(owner.run, stop)
            with trio.fail_after(TIMEOUT_S):
                while not all(owner.prompts for owner in owners):
                    if any(owner.lost for owner in owners):
                        break
                    await trio.sleep(0.05)
            await trio.sleep(1)
            fds_before, rss_before = _fds(host.pid), _rss_kb(host.pid)
            log_before = _flood_lines(log_path)
            prompts_before = [owner.prompts for owner in owners]
            status_done = trio.Event()
            nursery.start_soon(probe_status, status_done)
            flood_started = time.monotonic()
            # Two flood processes, one per kind, so that neither slows the other's rate.
            async with trio.open_nursery() as flooders:
                for connects, wrong in ((args.connects, 0), (0, args.wrong)):
                    command = [
                        *(PYTHON, __file__, "--flood", address, port_text),
                        *("--seconds", str(args.seconds), "--connects", str(connects)),
                        *("--wrong", str(wrong)),
                    ]
                    flooders.start_soon(partial(trio.run_process, command, check=True))
            flood_took = time.monotonic() - flood_started
            fds_right_after, rss_right_after = _fds(host.pid), _rss_kb(host.pid)
            log_added = _flood_lines(log_path) - log_before
            prompts_during = [o.prompts - b for o, b in zip(owners, prompts_before, strict=True)]
            await trio.sleep(args.settle)
            status_done.set()
            stop.set()
        fds_after, rss_after = _fds(host.pid), _rss_kb(host.pid)
        for owner in owners:
            failures.extend(f"{owner.kind} owner lost: {what}" for what in owner.lost)
        per_minute = log_added * 60.0 / flood_took
        print(
            f"owner prompts during the flood: WebSocket {prompts_during[0]}, "
            f"Streamable HTTP {prompts_during[1]} ({CHUNKS} chunks each, every character checked)\n"
            f"slowest status over the Unix socket: {slowest[0] * 1000:.0f} ms\n"
            f"log lines added by the flood (not counting the owner's prompts and connections): "
            f"{log_added} in {flood_took:.0f} s "
            f"({per_minute:.1f} a minute)\n"
            f"host open files: {fds_before} before, {fds_right_after} right after, "
            f"{fds_after} {args.settle:.0f} s after\n"
            f"host RSS: {rss_before // 1024} MiB before, {rss_right_after // 1024} MiB right "
            f"after, {rss_after // 1024} MiB {args.settle:.0f} s after",
            flush=True,
        )
        if not all(prompts_during):
            failures.append(f"an owner finished no prompt during the flood: {prompts_during}")
        if slowest[0] > STATUS_WITHIN_S:
            failures.append(f"a status answer took {slowest[0]:.2f} s (limit {STATUS_WITHIN_S} s)")
        allowed_lines = MAX_LOG_LINES_PER_MINUTE * max(1.0, flood_took / 60.0)
        if log_added > allowed_lines:
            failures.append(
                f"the log grew {log_added} lines in {flood_took:.0f} s "
                f"(at most {MAX_LOG_LINES_PER_MINUTE} a minute)"
            )
        if fds_after > fds_before + FD_SLACK:
            failures.append(f"open files did not come back: {fds_before} -> {fds_after}")
        if rss_after > rss_before + RSS_SLACK_KB:
            failures.append(f"RSS did not settle: {rss_before // 1024} -> {rss_after // 1024} MiB")
    finally:
        host.send_signal(signal.SIGTERM)
        try:
            host.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            host.kill()
            failures.append("the host did not stop within its deadline")
        if failures:
            tail = log_path.read_text(errors="replace").splitlines()[-20:]
            print("host log tail:\n  " + "\n  ".join(tail), file=sys.stderr)
    for failure in failures:
        print(f"FAILED: {failure}", flush=True)
    return 1 if failures else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--connects", type=int, default=2000, help="connect-and-close a second")
    parser.add_argument("--wrong", type=int, default=1000, help="wrong-token requests a second")
    parser.add_argument("--nofile", type=int, default=1024, help="the host's open-file limit")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before 'after'")
    parser.add_argument("--flood", nargs=2, metavar=("HOST", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flood:
        host, port = args.flood
        trio.run(flood, host, int(port), args.connects, args.wrong, args.seconds)
        return
    sys.exit(trio.run(judge, args))


if __name__ == "__main__":
    main()
